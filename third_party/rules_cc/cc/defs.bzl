"""The native C++ rules under the names rules_cc exports.

Debian's bazel-rules-cc is newer than the Bazel it ships with (4.2.3), so this shim re-exports the
built-in rules instead.
"""

cc_binary = native.cc_binary
cc_import = native.cc_import
cc_library = native.cc_library
cc_test = native.cc_test
cc_toolchain = native.cc_toolchain
cc_toolchain_suite = native.cc_toolchain_suite
