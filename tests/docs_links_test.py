#!/usr/bin/env python3
"""The documentation's links and the repository paths it names, checked against the source tree.

Pages: README.md, every docs/**/*.md and tools/bench/README.md. For each page:
  - every relative link or image ([text](target), [id]: target) points at a file or folder that
    exists, and a #fragment into a markdown page (or into the page itself) names one of its
    headings, slugged as GitHub slugs them;
  - every repository path named in code (`inline code`, fenced or indented code blocks) exists:
    a file or folder (`server/core/memory/planner.cc`, `tools/gpu/check.sh`), a module named
    without its extension (`server/core/specs/tensor_file` for tensor_file.h/.cc), a test target
    written as a path (`tests/slurm_cluster_test`), a path .gitignore ignores (what tools write:
    `deploy/examples/data/ratings.dat`), a glob
    (`worker/ddp/*.cc`), or a Bazel label (`//worker:fitrun-worker`, `server/core:job_spec_test`:
    the package has a BUILD file that declares the target, or the label names a file in it). A
    path with a placeholder (`tests/fuzz/corpus/<name>`) is checked up to the placeholder.

It reads the real source tree, not the runfiles: Bazel's processwrapper sandbox leaves the
filesystem visible, and README.md in the runfiles is a symbolic link into the tree, so a new page
or a renamed file is checked without declaring it in a BUILD file (and the test is tagged
"external" so that Bazel never answers from its cache). Outside Bazel it checks the tree it lives
in:   /usr/bin/python3 tests/docs_links_test.py [ROOT]

It also checks the names the pages use against the code (docs_names.py): every fitrund and fitrun
flag, spec field, `fitrun` subcommand and FITRUN_ variable a page names exists, read from the sources
the BUILD file passes (--fitrund, --cli, --spec_proto, --env, --other; by hand, DEFAULT_SOURCES
under ROOT), and every one the code defines is documented in README.md or docs/.

Before the real tree it checks a small made-up one with known faults, and made-up sources and pages
for the names (a made-up flag and field in a page, an undocumented flag), so a checker that stopped
finding them fails too.
"""
import fnmatch
import glob
import os
import re
import sys
import tempfile

import docs_names

# What a path in code must start with to count as a repository path. A new top-level folder
# needs a line here.
TOP_LEVEL = ("client", "deploy", "docs", "proto", "server", "tests", "third_party", "tools",
             "worker", ".ci", "README.md", "WORKSPACE", "BUILD", ".bazelrc")
# Tried after a path that does not exist as written: a module is named without its extension.
MODULE_EXTENSIONS = (".h", ".cc", ".py", ".sh", ".md", ".proto", ".bzl")
PATH_START = re.compile(r"^(//)?(%s)(/|:|$)" % "|".join(re.escape(t) for t in TOP_LEVEL))
PLACEHOLDER = re.compile(r"[<>*{}]|\.\.\.|^N$")
FENCE = re.compile(r"^ {0,3}(```|~~~)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^ {0,3}\[[^\]\n]+\]:[ \t]*<?([^\s>]+)>?.*$", re.M)
# A code span may run over a line end, never over a blank line.
CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)((?:[^`\n]|\n(?![ \t]*\n)|`+(?!`))+?)(?<!`)\1(?!`)")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.I)


def pages(root):
    found = [os.path.join(root, "README.md"), os.path.join(root, "tools", "bench", "README.md")]
    found += sorted(glob.glob(os.path.join(root, "docs", "**", "*.md"), recursive=True))
    return [p for p in found if os.path.isfile(p)]


def github_slug(heading):
    """The anchor GitHub gives a heading: its text as rendered, lower case, without punctuation
    but '-' and '_', spaces as '-' (runs of them are not collapsed)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links and images: their text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "")
    text = text.strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in "-_ " or _is_mark(c))
    return text.replace(" ", "-")


def _is_mark(c):
    import unicodedata
    return unicodedata.category(c).startswith("M")


def split_page(text):
    """Yields (line number, line, in_code_block)."""
    in_fence = False
    previous_blank = True
    in_indented = False
    for number, line in enumerate(text.split("\n"), 1):
        if FENCE.match(line):
            yield number, line, True
            in_fence = not in_fence
            previous_blank = False
            continue
        if in_fence:
            yield number, line, True
            continue
        blank = not line.strip()
        if line.startswith("    ") and (previous_blank or in_indented) and not blank:
            in_indented = True
        elif not blank:
            in_indented = False
        yield number, line, in_indented
        previous_blank = blank


def anchors_of(path, cache):
    if path not in cache:
        slugs = set()
        counts = {}
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for _, line, code in split_page(text):
            if code:
                continue
            for name in HTML_ANCHOR.findall(line):
                slugs.add(name)
            m = HEADING.match(line)
            if not m:
                continue
            slug = github_slug(m.group(2))
            n = counts.get(slug, 0)
            counts[slug] = n + 1
            slugs.add(slug if n == 0 else "%s-%d" % (slug, n))
        cache[path] = slugs
    return cache[path]


def check_link(root, page, target, anchor_cache):
    if not target or re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
        return None  # empty, or http:, https:, mailto: ...
    path, _, fragment = target.partition("#")
    if path.startswith("/"):
        resolved = os.path.join(root, path.lstrip("/"))
    elif path:
        resolved = os.path.join(os.path.dirname(page), path)
    else:
        resolved = page
    resolved = os.path.normpath(resolved)
    if not os.path.exists(resolved):
        return "link to %s: no such file or folder" % target
    if not os.path.realpath(resolved).startswith(os.path.realpath(root)):
        return "link to %s: outside the repository" % target
    if fragment and resolved.endswith(".md") and os.path.isfile(resolved):
        if fragment not in anchors_of(resolved, anchor_cache):
            return "link to %s: %s has no heading with the anchor #%s" % (
                target, os.path.relpath(resolved, root), fragment)
    return None


def build_declares(package_dir, name):
    for build in ("BUILD", "BUILD.bazel"):
        path = os.path.join(package_dir, build)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                text = f.read()
            candidates = [name]
            for suffix in ("_test", "_fuzzer", "_target"):  # tests/fuzz/fuzz.bzl's targets
                if name.endswith(suffix):
                    candidates.append(name[: -len(suffix)])
            return any('"%s"' % c in text for c in candidates)
    return None  # no BUILD file


def ignored_patterns(root, cache={}):
    """The root .gitignore's patterns: what builds and tools write into the tree."""
    if root not in cache:
        patterns = []
        path = os.path.join(root, ".gitignore")
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                for line in f:
                    line = line.strip()
                    if line and not line.startswith(("#", "!")):
                        patterns.append(line)
        cache[root] = patterns
    return cache[root]


def is_ignored(root, relative):
    """Whether git ignores `relative` (or a folder above it): a path the tools write, such as
    deploy/examples/data/ratings.dat, which a page may name before it exists."""
    parts = relative.split("/")
    for pattern in ignored_patterns(root):
        anchored = pattern.startswith("/") or "/" in pattern.rstrip("/")
        pattern = pattern.strip("/")
        for i in range(1, len(parts) + 1):
            if anchored:
                if fnmatch.fnmatchcase("/".join(parts[:i]), pattern):
                    return True
            elif fnmatch.fnmatchcase(parts[i - 1], pattern):
                return True
    return False


def check_path(root, token):
    """None when the repository path `token` exists, else what is wrong."""
    token = token.rstrip(".,:;")
    if token.startswith("//") or (":" in token and not token.startswith("http")):
        package, _, name = token.lstrip("/").partition(":")
        package = package.rstrip("/")
        package_dir = os.path.join(root, package)
        if not os.path.isdir(package_dir):
            return "no package folder %s" % package
        if not name:
            if build_declares(package_dir, os.path.basename(package)) is None:
                return "%s has no BUILD file" % package
            return None
        if PLACEHOLDER.search(name):
            declared = build_declares(package_dir, "")
            return "%s has no BUILD file" % package if declared is None else None
        if os.path.exists(os.path.join(package_dir, name)):
            return None  # a file label
        declared = build_declares(package_dir, name)
        if declared is None:
            return "%s has no BUILD file" % package
        if not declared:
            return "%s/BUILD declares no target %s" % (package, name)
        return None
    parts = token.rstrip("/").split("/")
    checked = []
    for part in parts:
        if PLACEHOLDER.search(part) and "*" not in part:
            break
        checked.append(part)
    path = os.path.join(root, *checked)
    if "*" in path:
        return None if glob.glob(path, recursive=True) else "nothing matches %s" % "/".join(checked)
    if os.path.exists(path):
        return None
    if any(os.path.exists(path + ext) for ext in MODULE_EXTENSIONS):
        return None
    if len(checked) == len(parts) and build_declares(os.path.dirname(path), parts[-1]):
        return None  # a target written as a path: `tests/slurm_cluster_test`
    if is_ignored(root, "/".join(checked)):
        return None  # written by a tool or the build
    return "no such file or folder: %s" % "/".join(checked)


def code_tokens(text):
    """Repository paths in a piece of code, with their offsets in it."""
    for m in re.finditer(r"[^\s()\[\]{},;'\"=|`<>]+(?:<[^>\s]*>[^\s()\[\]{},;'\"=|`<>]*)*", text):
        token = m.group(0)
        start = m.start()
        if token.startswith("./"):
            token, start = token[2:], start + 2
        if PATH_START.match(token):
            yield token, start


def check_page(root, page, anchor_cache):
    problems = []
    with open(page, encoding="utf-8") as f:
        text = f.read()
    lines = list(split_page(text))
    # Code blocks: every path in them. The rest (prose, with blank lines where code blocks were):
    # code spans, which may run over a line end, then links, whose text may too.
    prose_lines = []
    for number, line, code in lines:
        if code:
            for token, _ in code_tokens(line):
                problem = check_path(root, token)
                if problem:
                    problems.append((number, "`%s`: %s" % (token, problem)))
            prose_lines.append("")
        else:
            prose_lines.append(line)
    prose = "\n".join(prose_lines)

    def line_of(offset):
        return prose.count("\n", 0, offset) + 1

    for m in CODE_SPAN.finditer(prose):
        for token, start in code_tokens(m.group(2)):
            problem = check_path(root, token)
            if problem:
                problems.append((line_of(m.start(2) + start), "`%s`: %s" % (token, problem)))
    # Code spans become filler of the same length, so offsets and line numbers stay.
    prose = CODE_SPAN.sub(lambda m: re.sub(r"[^\n]", "x", m.group(0)), prose)
    for m in INLINE_LINK.finditer(prose):
        problem = check_link(root, page, m.group(1), anchor_cache)
        if problem:
            problems.append((line_of(m.start(1)), problem))
    for m in REFERENCE_DEF.finditer(prose):
        problem = check_link(root, page, m.group(1), anchor_cache)
        if problem:
            problems.append((line_of(m.start(1)), problem))
    return sorted(problems)


def check_tree(root):
    anchor_cache = {}
    problems = []
    for page in pages(root):
        for number, problem in check_page(root, page, anchor_cache):
            problems.append("%s:%d: %s" % (os.path.relpath(page, root), number, problem))
    return problems


def self_test():
    """The checker against a made-up tree: what must pass passes, what must fail fails."""
    assert github_slug("Time to train: `fitrun submit` against PyTorch DDP launched directly") == \
        "time-to-train-fitrun-submit-against-pytorch-ddp-launched-directly"
    assert github_slug("fitrun-worker against PyTorch's DistributedDataParallel") == \
        "fitrun-worker-against-pytorchs-distributeddataparallel"
    assert github_slug("Loading data once: the decoded-dataset cache") == \
        "loading-data-once-the-decoded-dataset-cache"
    assert github_slug("`fitrun top`") == "fitrun-top"
    with tempfile.TemporaryDirectory() as root:
        def write(path, text):
            os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
            with open(os.path.join(root, path), "w", encoding="utf-8") as f:
                f.write(text)
        write("server/core/BUILD", 'cc_test(name = "planner_test")\nfitrun_fuzz_target(name = "job_spec_fuzz")\n')
        write("server/core/planner.cc", "")
        write("server/core/planner.h", "")
        write(".gitignore", "/bazel-*\n/deploy/examples/data/\n__pycache__/\n")
        write("docs/topic.md", "# Topic\n\n## Same\n\n## Same\n\n### `fitrun top`\n")
        write("README.md", "\n".join([
            "# Top",
            "[good](docs/topic.md) [good anchor](docs/topic.md#same-1) [here](#top)",
            "[web](https://example.com/x) ![img](docs/topic.md) [code](docs/topic.md#fitrun-top)",
            "`server/core/planner.cc` `server/core/planner` `//server/core:planner_test`",
            "`server/core:job_spec_fuzz_test` `server/core/*.cc` `server/core/<name>/x` `bazel-bin/x`",
            "`server/core/planner_test` `server/core/planner_tests` `deploy/examples/data/ratings.dat`",
            "",
            "```",
            "# not a heading",
            "fitrun submit server/core/planner.cc --watch",
            "```",
            "",
            "[bad file](docs/missing.md)",
            "[bad anchor](docs/topic.md#nope)",
            "[bad local anchor](#not-a-heading)",
            "`server/core/memory/planner.cc` `//server/core:estimator_test` `tools/gpu:check`",
            "",
            "```",
            "bash tools/gpu/check.sh",
            "```",
            "[in code](docs/missing-too.md) is a link; `[in a span](#nope)` is not",
            "a [link over",
            "two lines](docs/missing-split.md) and `a span over server/core/planner.cc",
            "two lines, server/core/absent.cc` then `server/core/planner.h` [ok](#top)",
        ]) + "\n")
        found = check_tree(root)
        expected = [
            "README.md:6: `server/core/planner_tests`",
            "README.md:13: link to docs/missing.md",
            "README.md:14: link to docs/topic.md#nope",
            "README.md:15: link to #not-a-heading",
            "README.md:16: `server/core/memory/planner.cc`",
            "README.md:16: `//server/core:estimator_test`",
            "README.md:16: `tools/gpu:check`",
            "README.md:19: `tools/gpu/check.sh`",
            "README.md:21: link to docs/missing-too.md",
            "README.md:23: link to docs/missing-split.md",
            "README.md:24: `server/core/absent.cc`",
        ]
        for e in expected:
            assert any(f.startswith(e) for f in found), "self-test: not found: %s\nfound:\n%s" % (
                e, "\n".join(found))
        assert len(found) == len(expected), "self-test: more than expected:\n%s" % "\n".join(found)


def names_self_test():
    """The names check against made-up sources and pages: a made-up flag, field, subcommand and
    variable in a page are found, so are an undocumented flag, field, subcommand and variable,
    and what is right passes."""
    with tempfile.TemporaryDirectory() as root:
        def write(path, text):
            os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
            with open(os.path.join(root, path), "w", encoding="utf-8") as f:
                f.write(text)
            return os.path.join(root, path)
        main_cc = write("server/main.cc", "\n".join([
            'ABSL_FLAG(std::string, listen, "127.0.0.1:7070", "gRPC address");',
            'ABSL_FLAG(std::vector<std::string>, data_roots, {},',
            '          "folders a spec may read");',
            'ABSL_FLAG(bool, secret_switch, false, "nobody wrote about this one");',
        ]))
        cli_cc = write("client/cli.cc", "\n".join([
            'const CliArg kJson{"--json", "print JSON", &CliOptions::json};',
            '      {"submit",',
            '       "submit a job spec",',
            '       {kSpec, {"--watch", "then follow it", &CliOptions::watch}},',
            '      {"logs",',
            '       "print a log",',
            '       {kJobId, {"--follow,-f", "keep printing", &CliOptions::follow}},',
            '      {"forgotten",',
            '       "a subcommand no page names",',
            '       {kJobId}},',
            'app.add_option("--coordinator", options.coordinator, "HOST:PORT")->envname("FITRUN_COORDINATOR");',
        ]))
        proto = write("proto/job.proto", "\n".join([
            "message JobSpec {",
            "  string name = 1;",
            "  // A comment naming a field: int32 ghost = 9;",
            "  Resources resources = 2;",
            "  ScriptSpec script = 3;",
            "  FaultTolerance fault_tolerance = 4;",
            "}",
            "message Resources {",
            "  int32 max_devices = 1;",
            "  optional int64 per_device_batch = 2;",
            "  int32 hidden_knob = 3;",
            "}",
            "message ScriptSpec {",
            "  repeated string command = 1;",
            "  map<string, string> env = 2;",
            "}",
            "message FaultTolerance {",
            "  oneof limit { int32 max_restarts = 1; }",
            "  enum Kind { KIND_UNSPECIFIED = 0; }",
            "  double stop_grace_seconds = 2;",
            "}",
        ]))
        contract = write("proto/contract.h", "\n".join([
            "#ifndef FITRUN_PROTO_CONTRACT_H_",
            'inline constexpr char kJobId[] = "FITRUN_JOB_ID";',
            'inline constexpr char kUnsaid[] = "FITRUN_UNSAID";',
        ]))
        cmake = write("worker/CMakeLists.txt", "option(FITRUN_WITH_CUDA \"CUDA\" OFF)\n")
        bench = write("server/bench/bench.cc", "// --repeat N runs it N times\n")
        defs = docs_names.Definitions([main_cc], [cli_cc], proto, [contract, cli_cc, cmake], [bench])
        assert defs.fitrund_flags == {"listen", "data_roots", "secret_switch"}, defs.fitrund_flags
        assert defs.cli_flags == {"json", "watch", "follow", "coordinator"}, defs.cli_flags
        assert defs.subcommands == {"submit", "logs", "forgotten"}, defs.subcommands
        assert set(defs.spec_fields) == {
            "name", "resources", "resources.max_devices", "resources.per_device_batch",
            "resources.hidden_knob", "script", "script.command", "script.env", "fault_tolerance",
            "fault_tolerance.max_restarts", "fault_tolerance.stop_grace_seconds"}, defs.spec_fields
        assert defs.variables == {"FITRUN_JOB_ID", "FITRUN_UNSAID", "FITRUN_COORDINATOR"}, defs.variables
        page = "\n".join([
            "# Page",
            "fitrund's `--listen` and `--data_roots=/srv`, `--repeat 3`, sbatch's `--partition` and `--account`,",
            "`--gpus-per-task`, a `spec.resources.max_devices` and `resources.per_device_batch`, `model.pt`,",
            "`fault_tolerance: {max_restarts, stop_grace_seconds}` `fitrun submit job.yaml --watch`",
            "`fitrun logs ID -f --follow` and FITRUN_JOB_ID, FITRUN_WITH_CUDA, `fitrun --coordinator=h:1 --json` (FITRUN_COORDINATOR)",
            "",
            "```yaml",
            "name: x",
            "resources:",
            "  max_devices: 2        # a comment: bogus: 1",
            "script: {command: [a, b], env: {ANY_NAME: 1}}",
            "```",
            "",
            "```sh",
            "fitrund --listen=0.0.0.0:7070 \\",
            "  --data_roots=/srv",
            "```",
            "",
            "Wrong: fitrund's `--made_up_flag`, `resources.gpu_count`, `spec.resources.imaginary`,",
            "`fault_tolerance: {max_restarts, retries}` `fitrun frobnicate 1` `fitrun get 1 --colour`",
            "and FITRUN_NO_SUCH_THING.",
            "",
            "```yaml",
            "resources: {max_devices: 2, devices_wanted: 3}",
            "made_up_field: 1",
            "```",
            "",
            "```sh",
            "fitrund --listen=:7070 \\",
            "  --bogus_flag=1",
            "```",
        ])
        texts = [("docs/page.md", page)]
        found = ["%s:%d: %s" % p for p in docs_names.names_in_pages(defs, texts, split_page, CODE_SPAN)]
        expected = [
            "docs/page.md:19: --made_up_flag",
            "docs/page.md:19: spec field resources.gpu_count",
            "docs/page.md:19: spec field resources.imaginary",
            "docs/page.md:20: spec field fault_tolerance.retries",
            "docs/page.md:20: fitrun frobnicate",
            "docs/page.md:20: fitrun get",
            "docs/page.md:20: fitrun --colour",
            "docs/page.md:21: FITRUN_NO_SUCH_THING",
            "docs/page.md:24: spec field resources.devices_wanted",
            "docs/page.md:24: spec field made_up_field",
            "docs/page.md:29: fitrund --bogus_flag",
        ]
        for e in expected:
            assert any(f.startswith(e) for f in found), "names self-test: not found: %s\nfound:\n%s" % (
                e, "\n".join(found))
        assert len(found) == len(expected), "names self-test: more than expected:\n%s" % "\n".join(found)
        missing = docs_names.undocumented(defs, texts, split_page, CODE_SPAN)
        assert missing == [
            "fitrund's flag --secret_switch",
            "the subcommand `fitrun forgotten`",
            "the spec field resources.hidden_knob",
            "the variable FITRUN_UNSAID",
        ], "names self-test: undocumented:\n%s" % "\n".join(missing)
        hyphenated = docs_names.Definitions(
            [main_cc], [cli_cc, write("client/more.cc", '{"--dry-run", "only say", &CliOptions::dry},')],
            proto, [contract], [])
        assert hyphenated.problems() and "--dry-run" in hyphenated.problems()[0], hyphenated.problems()


# The sources the names are read from (docs_names), by kind: as the BUILD file passes them
# ("--fitrund PATH... --cli PATH... ..."), relative to the runfiles; by hand, these from ROOT.
SOURCE_KINDS = ("fitrund", "cli", "spec_proto", "env", "other")
DEFAULT_SOURCES = {
    "fitrund": ["server/main.cc"],
    "cli": ["client/cli.cc"],
    "spec_proto": ["proto/fitrun/v1/job.proto"],
    "env": ["proto/contract/launch_contract.h", "client/cli.cc", "client/python/fitrun/client.py",
            "client/python/fitrun/contract.py", "server/launcher/slurm_launcher.cc",
            "worker/slurm/rank_shim.sh", "worker/CMakeLists.txt", "tools/demo.sh", "tools/test.sh"],
    "other": ["server/bench/*.cc", "server/bench/*/*.cc", "worker/options.cc", "tools/bench/*.py",
              "tools/bench/scripts/*.py", "deploy/examples/scripts/*/train.py", ".bazelrc"],
}


def parse_args(argv):
    """[ROOT] [--KIND PATH...]...: the source tree, and the sources of each kind."""
    root = None
    sources = {}
    kind = None
    for arg in argv:
        if arg.startswith("--") and arg[2:] in SOURCE_KINDS:
            kind = arg[2:]
            sources.setdefault(kind, [])
        elif kind:
            sources[kind].append(arg)
        else:
            root = arg
    return root, sources


def runfiles_dir():
    if os.environ.get("TEST_SRCDIR"):
        return os.path.join(os.environ["TEST_SRCDIR"], os.environ.get("TEST_WORKSPACE", "fitrun"))
    return None


def source_root(root_arg=None):
    if root_arg:
        return os.path.abspath(root_arg)
    runfiles = runfiles_dir() or ""
    readme = os.path.join(runfiles, "README.md")
    if os.environ.get("TEST_SRCDIR") and os.path.exists(readme):
        return os.path.dirname(os.path.realpath(readme))
    return os.path.dirname(os.path.dirname(os.path.realpath(__file__)))


def resolve_sources(root, sources):
    """{kind: [absolute path]}: the given ones (relative to the runfiles under Bazel), else the defaults."""
    resolved = {}
    base = runfiles_dir() or os.getcwd()
    for kind in SOURCE_KINDS:
        if kind in sources:
            resolved[kind] = [p if os.path.isabs(p) else os.path.join(base, p) for p in sources[kind]]
        else:
            resolved[kind] = sorted(f for pattern in DEFAULT_SOURCES[kind]
                                    for f in glob.glob(os.path.join(root, pattern)))
    return resolved


def load_definitions(sources):
    return docs_names.Definitions(sources["fitrund"], sources["cli"], sources["spec_proto"][0],
                                  sources["env"], sources["other"])


def check_names(root, defs):
    """The names the pages use against the definitions, and the definitions no page documents."""
    texts = []
    for page in pages(root):
        with open(page, encoding="utf-8") as f:
            texts.append((os.path.relpath(page, root), f.read()))
    problems = ["%s:%d: %s" % p for p in docs_names.names_in_pages(defs, texts, split_page, CODE_SPAN)]
    problems += defs.problems()
    problems += ["undocumented: %s (README.md and docs/ never name it)" % m
                 for m in docs_names.undocumented(defs, texts, split_page, CODE_SPAN)]
    return problems


def main():
    root_arg, given = parse_args(sys.argv[1:])
    self_test()
    names_self_test()
    root = source_root(root_arg)
    if not os.path.isfile(os.path.join(root, "WORKSPACE")):
        print("docs_links_test: %s is not the source tree (no WORKSPACE): the README in the runfiles "
              "was not a link into it" % root)
        return 1
    sources = resolve_sources(root, given)
    missing = [p for kind in SOURCE_KINDS for p in sources[kind] if not os.path.isfile(p)]
    if missing or not all(sources[kind] for kind in SOURCE_KINDS):
        print("docs_links_test: sources missing: %s" % (missing or [k for k in SOURCE_KINDS if not sources[k]]))
        return 1
    problems = check_tree(root) + check_names(root, load_definitions(sources))
    checked = pages(root)
    for p in problems:
        print(p)
    print("docs_links_test: %d pages under %s, %d problems" % (len(checked), root, len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
