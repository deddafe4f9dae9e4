// The built-in image models' shapes: what fitrund's analytic memory profiles count
// (server/core/specs/workload_profiles.cc) and what fitrun-worker builds (worker/models/model.cc),
// one fact in one place. Plain constants; both sides include them.
#ifndef FITRUN_PROTO_CONTRACT_MODEL_SHAPES_H_
#define FITRUN_PROTO_CONTRACT_MODEL_SHAPES_H_

#include <cstdint>

namespace fitrun::contract::models {

// A Fashion-MNIST image: 1 x 28 x 28, 10 classes.
inline constexpr int64_t kImageSide = 28;
inline constexpr int64_t kImagePixels = kImageSide * kImageSide;
inline constexpr int64_t kClasses = 10;

// mlp: PyTorch's MNIST MLP, kImagePixels-512-512-kClasses with ReLU.
inline constexpr int64_t kMlpHidden = 512;

// cnn: PyTorch's examples/mnist CNN without its dropout: conv 1->32 3x3, conv 32->64 3x3, max-pool 2,
// fc (64 x 12 x 12)->128, fc 128->kClasses.
inline constexpr int64_t kCnnConv1Channels = 32;
inline constexpr int64_t kCnnConv2Channels = 64;
inline constexpr int64_t kCnnKernel = 3;
inline constexpr int64_t kCnnPool = 2;
inline constexpr int64_t kCnnHidden = 128;
// The maps' sides: each 3x3 convolution takes 2 from each side's length, the pooling halves it.
inline constexpr int64_t kCnnConv1Side = kImageSide - (kCnnKernel - 1);
inline constexpr int64_t kCnnConv2Side = kCnnConv1Side - (kCnnKernel - 1);
inline constexpr int64_t kCnnPooledSide = kCnnConv2Side / kCnnPool;
inline constexpr int64_t kCnnFlattened = kCnnConv2Channels * kCnnPooledSide * kCnnPooledSide;
static_assert(kCnnFlattened == 9216, "the cnn's first fully connected layer takes 9216 features");

}  // namespace fitrun::contract::models

#endif  // FITRUN_PROTO_CONTRACT_MODEL_SHAPES_H_
