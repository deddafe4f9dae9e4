"""The names the documentation uses, against the code that defines them (tests/docs_links_test.py).

Four kinds of name, each read from the source files the test is given (never from a list here):
  - fitrund's flags: the ABSL_FLAG definitions of its main (server/main.cc); fitrun's flags and
    subcommands: the CLI's table (client/cli.cc: every "--name" it declares, and each
    {"name", "help", ...} entry of Subcommands());
  - spec fields: the JobSpec message of the spec proto (proto/fitrun/v1/job.proto) and every message
    under it, as dotted paths (resources.host_memory, fault_tolerance.max_restarts);
  - FITRUN_ variables: the "FITRUN_..." string literals of the sources that read or set them (the
    launch contract, the CLI, the Python client, the launchers, the Slurm shim's ${FITRUN_...});
    a FITRUN_ name in the docs may also be any other FITRUN_ name those sources use (a CMake option
    or compile definition such as FITRUN_WITH_CUDA);
  - other programs' flags: every --name in the sources of the repository's other programs (the
    benchmarks, the worker, .bazelrc), so a page may name them.

Two checks, over README.md, docs/**/*.md and tools/bench/README.md:
  - named in the docs => exists in the code:
      * a flag after `fitrund` in code (a span, or a code block's command, continued over "\\"
        line ends) is one of fitrund's; after `fitrun`, the next word is a subcommand and every flag
        one of the CLI's;
      * a span that is only flags (`--data_roots`, `--tls_cert=PEM`) names flags of fitrund, of
        fitrun or of another program of the repository, unless it is another program's by its
        spelling (hyphenated: none of fitrund's or fitrun's is, which is checked too) or by the
        words right before it (sbatch's `--partition`);
      * a dotted spec path in code (`resources.host_memory`, `spec.ddp.comm_hook`) whose first part
        is a field of JobSpec (or `spec.`) is a field path; every key of a ```yaml block, and of a
        span written as YAML from a top-level field (`fault_tolerance: {max_restarts, ...}`), is
        one (the keys of a map field such as script.env are the user's);
      * every FITRUN_ name is one the sources use.
  - defined in the code => documented: each of fitrund's and fitrun's flags appears as --name,
    each subcommand as `fitrun NAME` in code, each spec field as its dotted path, or as a key under
    its parent's name in YAML written in code (`gpt: {layers, heads}`; for a top-level field, a
    top-level key), and each FITRUN_ variable by name.
"""
import os
import re

# Spans and code lines: flags, dotted names, FITRUN_ names.
FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9_-]*)")
FITRUN_NAME = re.compile(r"\bFITRUN_[A-Z0-9_]*[A-Z0-9]\b")
DOTTED = re.compile(r"(?<![\w./$-])([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)+)(?![\w/(-])")
# Flags the flag libraries add to every program (absl's and CLI11's --help, absl's --helpfull and
# --flagfile), not defined in the program's own source.
_LIBRARY_FLAGS_RE = re.compile(r"^(help|helpfull|flagfile)$")


# ---------------------------------------------------------------------------------------------------
# The definitions, from the sources.

def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def absl_flags(text):
    return set(re.findall(r"ABSL_FLAG\(\s*[\w:<>, ]+?,\s*(\w+)\s*,", text))


def cli_flags(text):
    """Every "--name" (or "--name,-n") the CLI declares."""
    return set(re.findall(r"\"--([a-z][a-z0-9_-]*)(?:,-\w)?\"", text))


def cli_subcommands(text):
    """The names of the Subcommands() table's entries: {"name",\\n "help", ...}."""
    return set(re.findall(r"\{\"([a-z][a-z0-9-]*)\",\s*\n\s*\"", text))


def _strip_proto_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def _block_end(text, open_brace):
    depth = 0
    for i in range(open_brace, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    raise ValueError("unbalanced braces in the proto")


def proto_messages(text):
    """{message name: [(field name, type name, is_map)]}, nested messages by their simple names."""
    messages = {}

    def parse_body(body):
        fields = []
        i = 0
        rest = []
        while i < len(body):
            m = re.compile(r"\b(message|enum|oneof)\s+(\w+)\s*\{").search(body, i)
            if not m:
                rest.append(body[i:])
                break
            rest.append(body[i:m.start()])
            end = _block_end(body, m.end() - 1)
            inner = body[m.end():end]
            if m.group(1) == "message":
                messages[m.group(2)] = parse_body(inner)
            elif m.group(1) == "oneof":
                rest.append(inner)
            i = end + 1
        for m in re.finditer(r"(?:^|;|\n)\s*(?:optional\s+|repeated\s+)?(map\s*<[^>]*>|[\w.]+)\s+(\w+)\s*=\s*\d+",
                             "".join(rest)):
            kind = m.group(1)
            fields.append((m.group(2), kind.split(".")[-1], kind.startswith("map")))
        return fields

    text = _strip_proto_comments(text)
    i = 0
    while True:
        m = re.compile(r"\bmessage\s+(\w+)\s*\{").search(text, i)
        if not m:
            break
        end = _block_end(text, m.end() - 1)
        messages[m.group(1)] = parse_body(text[m.end():end])
        i = end + 1
    return messages


def spec_fields(proto_text, root="JobSpec"):
    """{dotted path: True when a map field (whose keys are the user's)} for every field under root."""
    messages = proto_messages(proto_text)
    if root not in messages:
        raise ValueError("the spec proto has no message %s" % root)
    paths = {}

    def walk(message, prefix, seen):
        for name, type_name, is_map in messages[message]:
            path = prefix + name
            paths[path] = is_map
            if type_name in messages and type_name not in seen:
                walk(type_name, path + ".", seen | {type_name})

    walk(root, "", {root})
    return paths


def fitrun_variables(path, text):
    """The FITRUN_ variables a source reads or sets: its "FITRUN_..." literals, in a shell script
    its ${FITRUN_...} and $FITRUN_... too."""
    if os.path.basename(path) == "CMakeLists.txt":
        return set()  # CMake's FITRUN_ names are build variables and compile definitions
    names = set(re.findall(r"[\"']((?:FITRUN_)[A-Z0-9_]*[A-Z0-9])[\"']", text))
    if path.endswith(".sh"):
        names |= set(re.findall(r"\$\{?(FITRUN_[A-Z0-9_]*[A-Z0-9])", text))
    return names


class Definitions:
    """What the code defines, read from the sources."""

    def __init__(self, fitrund_sources, cli_sources, spec_proto, env_sources, other_sources):
        self.fitrund_flags = set()
        for p in fitrund_sources:
            self.fitrund_flags |= absl_flags(read(p))
        self.cli_flags = set()
        self.subcommands = set()
        for p in cli_sources:
            text = read(p)
            self.cli_flags |= cli_flags(text)
            self.subcommands |= cli_subcommands(text)
        self.spec_fields = spec_fields(read(spec_proto))
        self.variables = set()
        self.fitrun_names = set()  # every FITRUN_ name the sources use (variables, CMake, macros)
        for p in env_sources:
            text = read(p)
            self.variables |= fitrun_variables(p, text)
            self.fitrun_names |= set(FITRUN_NAME.findall(text))
        self.other_flags = set()
        for p in other_sources:
            self.other_flags |= set(FLAG.findall(read(p)))
        empty = [what for what, names in (
            ("fitrund's flags", self.fitrund_flags), ("fitrun's flags", self.cli_flags),
            ("fitrun's subcommands", self.subcommands), ("spec fields", self.spec_fields),
            ("FITRUN_ variables", self.variables)) if not names]
        if empty:
            raise ValueError("read none of %s from the sources: did their definitions move?" % ", ".join(empty))

    def top_level_fields(self):
        return {p for p in self.spec_fields if "." not in p}

    def is_field(self, path):
        """Whether a dotted path names a field, or a key under a map field (script.env.HOME)."""
        parts = path.split(".")
        for i in range(len(parts), 0, -1):
            prefix = ".".join(parts[:i])
            if prefix in self.spec_fields:
                return i == len(parts) or self.spec_fields[prefix]
        return False

    def problems(self):
        """What is wrong with the definitions themselves for the checks' rules."""
        return ["--%s: a flag of %s spelled with a hyphen; the docs check takes hyphenated flags for "
                "other programs'" % (f, who)
                for who, flags in (("fitrund", self.fitrund_flags), ("fitrun", self.cli_flags))
                for f in sorted(flags) if "-" in f]


# ---------------------------------------------------------------------------------------------------
# YAML keys written in code: block mappings by indentation and flow mappings by braces, both with
# bare keys ({max_restarts, max_oom_retries}). Values are skipped; comments dropped.

def _strip_yaml_comment(line):
    quote = None
    for i, c in enumerate(line):
        if quote:
            if c == quote:
                quote = None
        elif c in "\"'":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i]
    return line


def flow_keys(text, base):
    """(path tuple) for every key of a flow mapping text such as `{kind: exit|oom, rank}`, under base."""
    keys = []
    stack = [base]
    last_key = None
    expecting_key = True
    i = 0
    while i < len(text):
        c = text[i]
        if c == "{":
            stack.append(stack[-1] + ((last_key,) if last_key else ()))
            last_key, expecting_key = None, True
            i += 1
        elif c == "}":
            if len(stack) > 1:
                stack.pop()
            last_key, expecting_key = None, False
            i += 1
        elif c == "[":
            depth, j = 0, i
            while j < len(text):
                depth += text[j] == "["
                depth -= text[j] == "]"
                j += 1
                if depth == 0:
                    break
            i = j
            expecting_key = False
        elif c == ",":
            last_key, expecting_key = None, True
            i += 1
        elif c.isspace():
            i += 1
        else:
            m = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(:(?=\s|\{|$)|(?=\s*[,}]))").match(text, i)
            # A key: "name:" anywhere, or a bare name inside braces ({max_restarts, heads}).
            if m and expecting_key and (m.group(2) == ":" or len(stack) > 1):
                keys.append(stack[-1] + (m.group(1),))
                last_key = m.group(1)
                expecting_key = False
                i = m.end()
            else:
                m = re.compile(r"\"[^\"]*\"|'[^']*'|[^,{}\[\]]+").match(text, i)
                i = m.end() if m else i + 1
                expecting_key = False
    return keys


def yaml_keys(text):
    """Key paths (tuples) of a piece of YAML: block mappings and flow mappings within them."""
    keys = []
    stack = []  # (indent, key)
    for raw in text.split("\n"):
        line = _strip_yaml_comment(raw).rstrip()
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        body = line.strip()
        while body.startswith("- "):
            indent += 2
            body = body[2:].lstrip()
        m = re.match(r"([A-Za-z_][A-Za-z0-9_]*)\s*:(?:\s+(.*)|$)", body)
        if not m:
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = tuple(k for _, k in stack) + (m.group(1),)
        keys.append(path)
        value = (m.group(2) or "").strip()
        if not value:
            stack.append((indent, m.group(1)))
        elif value.startswith("{"):
            keys += flow_keys(value, path[:-1] + (m.group(1),))
    return keys


# ---------------------------------------------------------------------------------------------------
# The pages' code: spans and code blocks, each with its line.

def code_pieces(text, split_page, code_span):
    """(line number, code, kind): kind "span", "block" (one command: a line, with "\\" continuations
    joined) or "yaml" (a whole ```yaml block, at its first line)."""
    pieces = []
    lines = list(split_page(text))
    prose = []
    i = 0
    while i < len(lines):
        number, line, code = lines[i]
        if code and re.match(r"^ {0,3}(```|~~~)\s*yaml\s*$", line):
            body = []
            i += 1
            while i < len(lines) and not re.match(r"^ {0,3}(```|~~~)", lines[i][1]):
                body.append(lines[i][1])
                prose.append("")
                i += 1
            pieces.append((number + 1, "\n".join(body), "yaml"))
            prose += ["", ""]
            i += 1
            continue
        if code:
            joined = line
            while joined.rstrip().endswith("\\") and i + 1 < len(lines) and lines[i + 1][2]:
                i += 1
                joined = joined.rstrip()[:-1] + " " + lines[i][1].strip()
                prose.append("")
            pieces.append((number, joined, "block"))
            prose.append("")
        else:
            prose.append(line)
        i += 1
    prose_text = "\n".join(prose)
    for m in code_span.finditer(prose_text):
        pieces.append((prose_text.count("\n", 0, m.start(2)) + 1, m.group(2), "span",
                       prose_text[max(0, m.start() - 80):m.start()]))
    return pieces


def _commands(code):
    """The commands of a piece of code: split at pipes, ;, && and ||, each a list of words."""
    for part in re.split(r"\|\||&&|[|;]|\$\(|`", code):
        words = part.split()
        while words and (words[0] in ("$", "sudo", "exec", "time") or re.match(r"^\w+=", words[0])):
            words = words[1:]
        if words:
            yield words


def _program(word):
    return os.path.basename(word.strip("\"'"))


# ---------------------------------------------------------------------------------------------------
# The two checks.

def names_in_pages(defs, page_texts, split_page, code_span):
    """(page, line, what is wrong) for each name a page uses that the code does not define."""
    problems = []
    top = defs.top_level_fields()
    all_flags = defs.fitrund_flags | defs.cli_flags | defs.other_flags
    for page, text in page_texts:
        # FITRUN_ names, in prose as in code.
        for number, line in enumerate(text.split("\n"), 1):
            for name in FITRUN_NAME.findall(line):
                if name not in defs.fitrun_names:
                    problems.append((page, number, "%s: no such FITRUN_ name in the sources" % name))
        for piece in code_pieces(text, split_page, code_span):
            number, code, kind = piece[:3]

            def problem(what):
                problems.append((page, number, what))

            if kind == "yaml":
                for path in yaml_keys(code):
                    dotted = ".".join(path)
                    if not defs.is_field(dotted):
                        problem("spec field %s: not in the spec proto" % dotted)
                continue
            # Spec fields: dotted paths from a top-level field or spec., and YAML from a top-level field.
            for m in DOTTED.finditer(code):
                dotted = m.group(1)
                first = dotted.split(".")[0]
                if first == "spec":
                    dotted = dotted[len("spec."):]
                elif first not in top:
                    continue
                if re.search(r"\.(pt|py|yaml|md|txt|json|gz|dat|so|h|cc)$", dotted):
                    continue  # a file: model.pt
                if code[m.end():].startswith(": unknown field"):
                    continue  # fitrund's refusal of a misspelt field, quoted
                if not defs.is_field(dotted):
                    problem("spec field %s: not in the spec proto" % dotted)
            if kind == "span":
                m = re.match(r"^([a-z_]+):\s*(\{.*\}|\S.*)?$", code.strip(), re.S)
                if m and m.group(1) in top and m.group(2) and m.group(2).startswith("{"):
                    for path in flow_keys(m.group(2), (m.group(1),)):
                        if not defs.is_field(".".join(path)):
                            problem("spec field %s: not in the spec proto" % ".".join(path))
            # Flags and subcommands, by the command they follow.
            commands = list(_commands(code))
            for words in commands:
                program = _program(words[0])
                if program == "fitrund":
                    for w in words[1:]:
                        flag = w[2:].split("=")[0] if w.startswith("--") else None
                        if flag and flag not in defs.fitrund_flags and not _LIBRARY_FLAGS_RE.match(flag):
                            problem("fitrund --%s: no such flag" % flag)
                elif program == "fitrun" and (kind == "block" or len(words) > 1):
                    rest = words[1:]
                    sub = next((w for w in rest if not w.startswith("-")), None)
                    if sub and re.match(r"^[a-z][a-z-]*$", sub) and sub not in defs.subcommands:
                        problem("fitrun %s: no such subcommand" % sub)
                    for w in rest:
                        if w.startswith("--"):
                            flag = w[2:].split("=")[0]
                            if flag not in defs.cli_flags and not _LIBRARY_FLAGS_RE.match(flag):
                                problem("fitrun --%s: no such flag" % flag)
            if kind == "span" and code.strip().startswith("--"):
                before = piece[3]
                # The owner named before it: sbatch's `--partition`, and the spans that follow
                # in the same list (sbatch's `--partition` and `--account`; train.py's own `--lr`).
                owner = re.search(r"([\w.-]+)'s\s+(?:own\s+)?(?:`[^`]*`\s*(?:,|and|or)\s*)*$", before)
                if owner and owner.group(1) not in ("fitrund", "fitrun"):
                    continue  # sbatch's `--partition`
                for flag in FLAG.findall(code):
                    if flag.endswith("_") and "*" in code:
                        if not any(f.startswith(flag) for f in all_flags):
                            problem("--%s*: matches no flag" % flag)
                    elif "-" in flag:
                        continue  # another program's spelling
                    elif flag not in all_flags and not _LIBRARY_FLAGS_RE.match(flag):
                        problem("--%s: no such flag of fitrund, fitrun or another program here" % flag)
    return problems


def undocumented(defs, page_texts, split_page, code_span):
    """The names defined in the code that no page documents."""
    text = "\n".join(t for _, t in page_texts)
    code = []
    yaml_paths = set()
    for _, page_text in page_texts:
        for piece in code_pieces(page_text, split_page, code_span):
            code.append(piece[1])
            yaml_paths |= set(yaml_keys(piece[1]))
            if piece[2] != "yaml":
                for m in re.finditer(r"(?:^|[\s(])([a-z_]+:\s*)?(\{.*\})", piece[1], re.S):
                    base = (m.group(1).rstrip(": "),) if m.group(1) else ()
                    yaml_paths |= set(flow_keys(m.group(2), base))
    code_text = "\n".join(code)
    whole_spans = {c.strip() for c in code}
    missing = []
    for who, flags in (("fitrund", defs.fitrund_flags), ("fitrun", defs.cli_flags)):
        for flag in sorted(flags):
            if not re.search(r"(?<![\w-])--%s(?![\w-])" % re.escape(flag), text):
                missing.append("%s's flag --%s" % (who, flag))
    for sub in sorted(defs.subcommands):
        if not re.search(r"\bfitrun\s+%s\b" % re.escape(sub), code_text):
            missing.append("the subcommand `fitrun %s`" % sub)
    pairs = {(p[-2] if len(p) > 1 else None, p[-1]) for p in yaml_paths}
    for path in sorted(defs.spec_fields):
        parts = path.split(".")
        if re.search(r"(?<![\w.])(spec\.)?%s(?![\w])" % re.escape(path), code_text) and "." in path:
            continue
        parent = parts[-2] if len(parts) > 1 else None
        if (parent, parts[-1]) in pairs or tuple(parts) in yaml_paths:
            continue
        if parent is None and (path in whole_spans or re.search(r"(?<![\w.])spec\.%s(?![\w])" % re.escape(path),
                                                                code_text)):
            continue  # `seed`, spec.seed
        missing.append("the spec field %s" % path)
    for name in sorted(defs.variables):
        if not re.search(r"\b%s\b" % re.escape(name), text):
            missing.append("the variable %s" % name)
    return missing
