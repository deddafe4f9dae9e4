"""One macro per fuzz target: the ordinary test build runs it as a smoke test, tools/fuzz.sh fuzzes it."""

load("@rules_cc//cc:defs.bzl", "cc_binary", "cc_library", "cc_test")

def fitrun_fuzz_target(name, srcs, deps, seconds = "2", size = "small"):
    """A libFuzzer target (LLVMFuzzerTestOneInput in `srcs`) as three targets:

    <name>_target   the target's code;
    <name>_test     runs it on its seed corpus (tests/fuzz/corpus/<name without "_fuzz">) and on mutations of the
                    seeds for `seconds`, with tests/fuzz/smoke_main.cc as its main (no libFuzzer in
                    the ordinary build);
    <name>_fuzzer   the libFuzzer binary, built only by tools/fuzz.sh (clang, -fsanitize=fuzzer).
    """
    if not name.endswith("_fuzz"):
        fail("a fuzz target's name ends in _fuzz: its seeds are tests/fuzz/corpus/<name without _fuzz>")
    corpus = name[:-len("_fuzz")]
    cc_library(
        name = name + "_target",
        srcs = srcs,
        deps = deps + ["//tests/fuzz:fuzz_input"],
        alwayslink = True,
        testonly = True,
    )
    cc_test(
        name = name + "_test",
        size = size,
        deps = [":" + name + "_target", "//tests/fuzz:smoke_main"],
        args = ["tests/fuzz/corpus/" + corpus, seconds],
        data = ["//tests/fuzz:corpus_" + corpus],
    )
    cc_binary(
        name = name + "_fuzzer",
        deps = [":" + name + "_target"],
        linkopts = ["-fsanitize=fuzzer"],
        tags = ["manual"],
        testonly = True,
    )
