#ifndef FITRUN_WORKER_DATA_TENSORS_H_
#define FITRUN_WORKER_DATA_TENSORS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "fitrun/v1/job.pb.h"
#include "worker/data/tensor_dataset.h"

namespace fitrun::worker {

// A dataset of a user's own tensors (spec.data.kind: tensors): a dict written in Python by
// torch.save({"inputs": x, "target": y}, path), read with torch::pickle_load. Every tensor has the
// samples along dimension 0, the same N for all; any dtype and trailing shape.
//
// The inputs are data.inputs in that order (the model's forward takes them so), or every key but
// the target, sorted; the target is data.target (default "target"). The test split is data.test_path
// (a file with the same keys, dtypes and trailing shapes) or the last floor(N * data.test_fraction)
// samples (default 0.1; proto/contract/data_contract.h), the training split the rest.
//
// Errors are INVALID_ARGUMENT naming the spec field and what was found: a file that is not a dict of
// tensors, a missing key, a tensor without a sample dimension, different N, a test file that does
// not match.
absl::StatusOr<TensorDataset> LoadTensors(const fitrun::v1::DataSpec& data, Split split);

// The keys of the model's inputs in forward's order, given every key of the file.
std::vector<std::string> TensorInputKeys(const fitrun::v1::DataSpec& data, const std::vector<std::string>& keys);

}  // namespace fitrun::worker

#endif  // FITRUN_WORKER_DATA_TENSORS_H_
