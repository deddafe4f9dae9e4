"""A repository for LibTorch, at the system location or wherever LIBTORCH_HOME points.

Debian installs LibTorch's headers straight under /usr/include (already on the compiler's path) with
the C++ frontend one level deeper; a downloaded LibTorch (the CUDA builds) keeps include/ and lib/ in
one folder. Both end up as the same two targets: @libtorch//:torch and, when the build has CUDA,
@libtorch//:torch_cuda.
"""

def _libtorch_repository_impl(ctx):
    home = ctx.os.environ.get("LIBTORCH_HOME", "/usr")
    if home == "/usr":
        include = "/usr/include"
        libdir = "/usr/lib/x86_64-linux-gnu"
    else:
        include = home + "/include"
        libdir = home + "/lib"
    if not ctx.path(include + "/torch/csrc/api/include/torch/torch.h").exists:
        fail("LibTorch not found under %s (set LIBTORCH_HOME or install libtorch-dev)" % home)

    # The frontend's headers sit below the system include path, so expose them through a symlink that
    # a cc_library can name relative to its own package.
    ctx.symlink(include + "/torch/csrc/api/include", "api_include")
    includes = ["api_include"]
    hdrs = 'glob(["api_include/**/*.h"])'
    if home != "/usr":
        # Every entry of include/ but google/: a downloaded LibTorch carries protobuf 3.13's headers
        # there, which would shadow Debian's 3.21 ones that the protos and gRPC are built with.
        for entry in ctx.path(include).readdir():
            if entry.basename != "google":
                ctx.symlink(entry, "include/" + entry.basename)
        includes.append("include")
        hdrs = 'glob(["api_include/**/*.h", "include/**/*.h", "include/**/*.hpp", "include/**/*.cuh"])'

    has_cuda = ctx.path(libdir + "/libtorch_cuda.so").exists

    # ProcessGroupGloo.hpp includes Gloo's own headers. Debian's LibTorch has Gloo (its headers come
    # with libgloo-dev, which tools/install-deps.sh installs); a downloaded LibTorch may or may not
    # carry them (PyTorch's pip wheels do not), and without them the worker is built without Gloo
    # and refuses CPU jobs (worker/torch_compat.h).
    has_gloo = home == "/usr" or ctx.path(include + "/gloo/algorithm.h").exists
    ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "torch",
    hdrs = {hdrs},
    includes = {includes},
    defines = {gloo_defines} + {cuda_defines},
    linkopts = [
        "-L{libdir}",
        "-Wl,-rpath,{libdir}",
        "-Wl,--no-as-needed",
        "-ltorch",
        "-ltorch_cpu",
        {cuda_libs}
        "-Wl,--as-needed",
        "-lc10",
    ],
)
""".format(
        hdrs = hdrs,
        includes = repr(includes),
        libdir = libdir,
        gloo_defines = '["USE_C10D_GLOO"]' if has_gloo else "[]",
        cuda_defines = '["FITRUN_WITH_CUDA", "USE_C10D_NCCL"]' if has_cuda else "[]",
        cuda_libs = '"-ltorch_cuda", "-lc10_cuda",' if has_cuda else "",
    ))

libtorch_repository = repository_rule(
    implementation = _libtorch_repository_impl,
    environ = ["LIBTORCH_HOME"],
    local = True,
)
