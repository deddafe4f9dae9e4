"""Another LibTorch's headers, as a tarball of its include/, for checks that compile against them.

//worker:libtorch_2_11_syntax_test compiles the worker's sources against the GPU machines' LibTorch,
which cannot be installed here. Its headers are not in this repository (third-party code): they
are looked for in shared/libtorch-headers/ beside the clone (../shared, as CI checks out). The
repository holds `tarball` (a filegroup: the tarball, or nothing when it is absent) and
`looked_for.txt` (where it was looked for), so a check can say what is missing instead of passing.
After adding the tarball, `bazel sync --configure` (or `bazel shutdown`) makes Bazel look again.
"""

def _libtorch_headers_repository_impl(ctx):
    clone = ctx.path(Label("//:WORKSPACE")).dirname
    tarball = clone.dirname.get_child("shared").get_child("libtorch-headers").get_child(ctx.attr.tarball)
    found = tarball.exists
    if found:
        ctx.symlink(tarball, ctx.attr.tarball)
    ctx.file("looked_for.txt", str(tarball) + "\n")
    ctx.file("BUILD", """
package(default_visibility = ["//visibility:public"])

filegroup(
    name = "tarball",
    srcs = {srcs},
)

exports_files(["looked_for.txt"])
""".format(srcs = repr([ctx.attr.tarball] if found else [])))

libtorch_headers_repository = repository_rule(
    implementation = _libtorch_headers_repository_impl,
    attrs = {"tarball": attr.string(mandatory = True, doc = "the file name in shared/libtorch-headers/")},
    local = True,
    configure = True,
)
