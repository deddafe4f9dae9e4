"""fitrun_proto_library: protoc + grpc_cpp_plugin from the system, as a genrule and a cc_library.

There are no proto_library / cc_grpc_library rules offline, so one macro runs Debian's protoc and
wraps what it generates. Imports resolve against this package's root (`import "fitrun/v1/x.proto"`)
and the system's well-known types.
"""

def fitrun_proto_library(name, srcs, deps = [], grpc = False, visibility = None):
    """Generates C++ (and with grpc=True, gRPC service) code for srcs under proto/.

    Args:
      name: the cc_library to create.
      srcs: .proto files, relative to this package.
      deps: other fitrun_proto_library targets whose protos these import.
      grpc: also generate service stubs (*.grpc.pb.{h,cc}).
      visibility: of the cc_library.
    """
    outs_h = []
    outs_cc = []
    for src in srcs:
        base = src[:-len(".proto")]
        outs_h.append(base + ".pb.h")
        outs_cc.append(base + ".pb.cc")
        if grpc:
            outs_h.append(base + ".grpc.pb.h")
            outs_cc.append(base + ".grpc.pb.cc")

    grpc_flags = ""
    if grpc:
        grpc_flags = "--plugin=protoc-gen-grpc=$$(command -v grpc_cpp_plugin) --grpc_out=$(GENDIR)/%s " % native.package_name()

    native.genrule(
        name = name + "_codegen",
        srcs = srcs + [d + "_srcs" for d in deps],
        outs = outs_h + outs_cc,
        cmd = "protoc -I%s --cpp_out=$(GENDIR)/%s %s%s" % (
            native.package_name(),
            native.package_name(),
            grpc_flags,
            " ".join(["$(location %s)" % s for s in srcs]),
        ),
    )
    native.filegroup(
        name = name + "_srcs",
        srcs = srcs,
    )
    native.cc_library(
        name = name,
        srcs = outs_cc,
        hdrs = outs_h,
        includes = ["."],
        deps = deps + ["//third_party:protobuf"] + (["//third_party:grpc"] if grpc else []),
        visibility = visibility,
    )
