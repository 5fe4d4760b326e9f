#!/usr/bin/env python3
"""The source layout rules, checked (python3, stdlib only).

  - no source file (.cc .h .cu .cuh) under common/, cpu/ or gpu/ is over 700 lines;
  - no function there is over 120 lines, counted from the line its signature starts on to the line
    of its closing brace (lambdas and local classes count inside their enclosing function);
  - include edges: common/ includes nothing from cpu/ or gpu/, and tools/ (the CLI) nothing from
    cpu/, gpu/, bench/ or fuzz/.

Prints one line per violation and exits 1 when there is any, else 0.
usage: scripts/check_layout.py [REPO_ROOT]
"""
import os
import re
import sys

SOURCE_EXTENSIONS = (".cc", ".h", ".cu", ".cuh")
SIZE_DIRS = ("common", "cpu", "gpu")
MAX_FILE_LINES = 700
MAX_FUNCTION_LINES = 120
# Directory -> top-level directories of this repository its files must not include from.
FORBIDDEN_INCLUDES = {
    "common": ("cpu", "gpu"),
    "tools": ("cpu", "gpu", "bench", "fuzz"),
}


def source_files(root, top):
    base = os.path.join(root, top)
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames.sort()
        for name in sorted(filenames):
            if name.endswith(SOURCE_EXTENSIONS):
                yield os.path.join(dirpath, name)


def blank_literal(text, i, out):
    """Appends the quoted literal starting at text[i] with its content blanked (an unterminated one
    ends at the line's end); returns where the code after it starts."""
    quote, j, n = text[i], i + 1, len(text)
    while j < n and text[j] != quote and text[j] != "\n":
        j += 2 if text[j] == "\\" else 1
    j = min(j, n)
    closed = j < n and text[j] == quote
    out.append(quote + " " * (j - i - 1) + (quote if closed else ""))
    return j + 1 if closed else j


def strip_code(text):
    """The text with comments, string and character literals and preprocessor lines blanked to
    spaces; newlines (so line numbers) and the literals' quotes stay."""
    out = []
    i, n = 0, len(text)
    at_line_start = True  # only whitespace since the last newline
    while i < n:
        c = text[i]
        nxt = text[i + 1] if i + 1 < n else ""
        if c == "\n":
            out.append(c)
            at_line_start = True
            i += 1
            continue
        if at_line_start and c == "#":
            # A directive, with its backslash continuations.
            while i < n and text[i] != "\n":
                if text[i] == "\\" and i + 1 < n and text[i + 1] == "\n":
                    out.append(" \n")
                    i += 2
                    continue
                out.append(" ")
                i += 1
            continue
        if not c.isspace():
            at_line_start = False
        if c == "/" and nxt == "/":
            while i < n and text[i] != "\n":
                out.append(" ")
                i += 1
            continue
        if c == "/" and nxt == "*":
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append(re.sub(r"[^\n]", " ", text[i:end]))
            i = end
            continue
        if c == '"':
            # A raw string: R"delim( ... )delim", with an optional u8/u/U/L prefix before the R.
            m = re.search(r"(?:\bu8|\bu|\bU|\bL|\b)R$", text[max(0, i - 3):i])
            if m:
                dm = re.match(r'"([^()\\\s]{0,16})\(', text[i:])
                if dm:
                    close = ")" + dm.group(1) + '"'
                    end = text.find(close, i + len(dm.group(0)))
                    end = n if end < 0 else end + len(close)
                    body = text[i + 1:end - 1]
                    out.append('"' + re.sub(r"[^\n]", " ", body) + '"')
                    i = end
                    continue
            i = blank_literal(text, i, out)
            continue
        if c == "'":
            # A digit separator (1'000'000) when the token it is in starts with a digit.
            k = i
            while k > 0 and (text[k - 1].isalnum() or text[k - 1] in "_'."):
                k -= 1
            if k < i and text[k].isdigit():
                out.append(c)
                i += 1
                continue
            i = blank_literal(text, i, out)
            continue
        out.append(c)
        i += 1
    return "".join(out)


def strip_templates(header):
    """header without its leading template<...> parameter lists."""
    while True:
        m = re.match(r"\s*template\s*<", header)
        if not m:
            return header
        depth, j = 1, m.end()
        while j < len(header) and depth:
            if header[j] == "<":
                depth += 1
            elif header[j] == ">":
                depth -= 1
            j += 1
        header = header[j:]


def top_level(header):
    """header with everything inside (), [] and <...> of a template-id removed, roughly: only what
    sits at parenthesis depth 0 stays, so default arguments do not read as initializers."""
    out, depth = [], 0
    for ch in header:
        if ch in "([":
            depth += 1
            out.append(ch if depth == 1 else "")
        elif ch in ")]":
            depth = max(0, depth - 1)
            out.append(ch if depth == 0 else "")
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def has_ctor_initializer(header):
    """A parameter list followed by a lone ':' (not '::'): a constructor's member initializers."""
    top = top_level(header)
    close = top.find(")")
    return close >= 0 and re.search(r"(?<!:):(?!:)", top[close:]) is not None


def classify(header):
    """What a '{' opens at namespace or class scope: 'scope' (namespace, extern "C", class, struct,
    union, enum), 'init' (a braced initializer), 'memberinit' (a member's braced initializer in a
    constructor's initializer list), 'func' (a function body) or 'block' (anything else)."""
    h = strip_templates(header)
    h = re.sub(r"^\s*(?:public|private|protected)\s*:(?!:)", " ", h)
    h = re.sub(r"\[\[.*?\]\]", " ", h)
    if re.match(r"\s*(?:inline\s+)?namespace\b", h) or re.match(r'\s*extern\s*"', h):
        return "scope"
    if re.match(r"\s*(?:typedef\s+)?(?:class|struct|union|enum)\b", h) and "(" not in top_level(h).split(":")[0]:
        return "scope"
    no_operator = re.sub(r"\boperator\s*(?:\(\s*\)|[^\s(]+)", "operator_", h)
    top = top_level(no_operator)
    if re.search(r"(?<![=!<>+\-*/%^&|])=(?!=)", top):
        return "init"
    if "(" in top and ")" in top:
        if has_ctor_initializer(no_operator) and re.search(r"[\w>]\s*$", no_operator):
            return "memberinit"
        return "func"
    # No parameter list: a member or variable with a braced initializer, else a bare block.
    return "init" if h.strip() else "block"


NOT_NAMES = {"__launch_bounds__", "__attribute__", "__declspec", "alignas", "decltype", "noexcept", "requires",
             "throw", "HWY_ATTR", "HWY_NOINLINE", "HWY_INLINE"}


def function_name(header):
    """The declared name: the first identifier before a '(' at the top level that is not an
    attribute, specifier or macro (CUDA's __launch_bounds__(...) comes before the name)."""
    h = re.sub(r"\boperator\s*(\(\s*\)|[^\s(]+)", lambda m: "operator" + m.group(1).replace(" ", ""),
               strip_templates(header))
    for m in re.finditer(r"([~\w:]*operator(?:\(\))?[^\s(]*|[~\w:]+)\s*\(", top_level(h)):
        if m.group(1).split("::")[-1] not in NOT_NAMES:
            return m.group(1)
    return "?"


def long_functions(code, limit):
    """(start_line, lines, name) of every function whose body spans more than `limit` lines."""
    found = []
    stack = []  # (kind, start_line, name) of each open brace
    header_start = 0  # where the text since the last ';', '{' or '}' begins
    carried = ""  # a constructor's signature so far, carried over a member's braced initializer
    line = 1
    i, n = 0, len(code)
    while i < n:
        c = code[i]
        if c == "\n":
            line += 1
        elif c == "{":
            header = carried + code[header_start:i]
            carried = ""
            if any(kind in ("func", "nested") for kind, _, _ in stack):
                kind = "nested"  # a block, lambda or local class inside a function
            elif stack and stack[-1][0] in ("init", "block"):
                kind = stack[-1][0]
            else:
                kind = classify(header)
            if kind == "memberinit":
                # The initializer's braces belong to the constructor's signature: skip them.
                depth, j = 1, i + 1
                while j < n and depth:
                    depth += {"{": 1, "}": -1}.get(code[j], 0)
                    line += code[j] == "\n"
                    j += 1
                carried = header + code[i:j]
                header_start = i = j
                continue
            start_line, name = line, ""
            if kind == "func":
                # The signature's first line: the header's first non-blank character.
                start_line = line - header.lstrip().count("\n")
                name = function_name(header)
            stack.append((kind, start_line, name))
            header_start = i + 1
        elif c == "}":
            if stack:
                kind, start_line, name = stack.pop()
                if kind == "func" and line - start_line + 1 > limit:
                    found.append((start_line, line - start_line + 1, name))
            header_start = i + 1
        elif c == ";":
            carried = ""
            header_start = i + 1
        i += 1
    return found


def include_violations(root, path, forbidden):
    rel = os.path.relpath(path, root)
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, text in enumerate(f, 1):
            m = re.match(r'\s*#\s*include\s*["<]([^">]+)[">]', text)
            if m and m.group(1).split("/")[0] in forbidden:
                yield f"{rel}:{number}: includes \"{m.group(1)}\""


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    violations = []
    for top in SIZE_DIRS:
        for path in source_files(root, top):
            rel = os.path.relpath(path, root)
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
            lines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
            if lines > MAX_FILE_LINES:
                violations.append(f"file over {MAX_FILE_LINES} lines: {rel}: {lines} lines")
            for start, length, name in long_functions(strip_code(text), MAX_FUNCTION_LINES):
                violations.append(f"function over {MAX_FUNCTION_LINES} lines: {rel}:{start}: {name}: {length} lines")
    for top, forbidden in FORBIDDEN_INCLUDES.items():
        for path in source_files(root, top):
            for v in include_violations(root, path, forbidden):
                violations.append(f"include edge: {v} ({top}/ includes nothing from "
                                  + ", ".join(d + "/" for d in forbidden) + ")")
    for v in violations:
        print(f"check_layout: {v}")
    if violations:
        print(f"check_layout: {len(violations)} violation(s)")
        return 1
    print("check_layout: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
