"""The native Java rules under the names rules_java exports.

fitrun builds no Java, but Bazel's own @bazel_tools//tools/jdk package loads this file while it
resolves toolchains; re-exporting the built-in rules keeps that offline.
"""

java_binary = native.java_binary
java_import = native.java_import
java_library = native.java_library
java_runtime = native.java_runtime
java_toolchain = native.java_toolchain
