#!/usr/bin/env python3
"""Turns a CUDA source (.cu or .cuh) into C++ for the emulated GPUs (emulator/).

The build runs it on every .cu and .cuh of the emulated build (cmake/emulated.cmake);
what is compiled is the kernels' own text after two mechanical rules, and nothing
else changes:

  (a) a launch
        kernel<<<grid, block[, shared[, stream]]>>>(args)
      becomes
        ::tlemu::launch("kernel", grid, block, shared or 0, stream or 0,
                        [=](auto... a) { kernel(a...); }, args)
      The kernel may be a name, a qualified name, a template-id (k<T, 4>) or a
      variable that holds a kernel pointer. The lambda captures by value: it runs
      later, on the stream's worker thread (tlemu/device.h).
  (b) a static __shared__ array (or scalar)
        __shared__ <attrs> T name[dims];
      becomes
        struct tlemu_shared_name { <attrs> T name[dims]; };
        auto& name = ::tlemu::block_shared<tlemu_shared_name>().name;
      (one storage per declaration and instantiation, per block: tlemu/device.h).

Comments and string literals are left alone. Every replacement keeps the number of
lines of what it replaces, and the output starts with a #line directive naming the
input, so the compiler's errors, __FILE__/__LINE__ and the sanitizers' reports point
at the original file and line.

A construct it does not understand (extern __shared__, a __shared__ declaration
with an initializer or several declarators, a launch whose kernel or configuration
it cannot read, a launch or __shared__ inside a preprocessor directive) stops it
with "FILE:LINE: error: ..." and exit status 1: the emulated build must not compile
something other than what the GPU build compiles.

  rewrite.py INPUT OUTPUT [LINE_NAME]
LINE_NAME is the input's name in the #line directive (default: its absolute path).
The build passes the path from the build folder, where the compiler runs, so that
the rewritten text is the same in every clone of the repository (ccache shares
what includes it). The output is written only when its text changes (so an
unchanged rewrite does not recompile what includes it).
"""
import os
import re
import sys

IDENT_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
KEYWORDS = {
    "alignas", "auto", "bool", "char", "const", "constexpr", "double", "extern", "float",
    "int", "long", "return", "short", "signed", "static", "struct", "unsigned", "void",
    "volatile", "if", "else", "for", "while", "do", "switch", "case", "new", "delete",
    "sizeof", "template", "typename", "operator",
}


class RewriteError(Exception):
    def __init__(self, pos, message):
        super().__init__(message)
        self.pos = pos


def mask_code(src):
    """src with the text of comments and string/char literals replaced by spaces
    (newlines kept), so that positions in it are positions in src and a search of
    it finds code only."""
    out = list(src)
    i, n = 0, len(src)

    def blank(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = src[i]
        if c == "/" and src.startswith("//", i):
            j = i
            while j < n and src[j] != "\n":
                # a backslash-newline continues a // comment
                j += 2 if src[j] == "\\" and j + 1 < n and src[j + 1] == "\n" else 1
            blank(i, j)
            i = j
        elif c == "/" and src.startswith("/*", i):
            j = src.find("*/", i + 2)
            if j < 0:
                raise RewriteError(i, "unterminated /* comment")
            blank(i, j + 2)
            i = j + 2
        elif c == '"':
            # A raw string: R"delim( ... )delim", with an optional encoding prefix.
            k = i
            while k > 0 and src[k - 1] in IDENT_CHARS:
                k -= 1
            prefix = src[k:i]
            if prefix in ("R", "LR", "uR", "UR", "u8R"):
                open_paren = src.find("(", i)
                delim = src[i + 1:open_paren]
                end = src.find(")" + delim + '"', open_paren)
                if open_paren < 0 or end < 0:
                    raise RewriteError(i, "unterminated raw string literal")
                blank(i + 1, end + len(delim) + 1)
                i = end + len(delim) + 2
                continue
            j = i + 1
            while j < n and src[j] != '"':
                if src[j] == "\n":
                    raise RewriteError(i, "unterminated string literal")
                j += 2 if src[j] == "\\" else 1
            blank(i + 1, j)
            i = j + 1
        elif c == "'":
            # A digit separator (1'000'000) or a character literal.
            k = i
            while k > 0 and (src[k - 1] in IDENT_CHARS or src[k - 1] in ".'"):
                k -= 1
            if k < i and src[k].isdigit():
                i += 1
                continue
            j = i + 1
            while j < n and src[j] != "'":
                if src[j] == "\n":
                    raise RewriteError(i, "unterminated character literal")
                j += 2 if src[j] == "\\" else 1
            blank(i + 1, j)
            i = j + 1
        else:
            i += 1
    return "".join(out)


def directive_ranges(code):
    """[start, end) of every preprocessor directive (continuation lines included)."""
    ranges = []
    pos = 0
    lines = code.split("\n")
    i = 0
    while i < len(lines):
        start = pos
        line = lines[i]
        if line.lstrip().startswith("#"):
            end = pos + len(line)
            while line.endswith("\\") and i + 1 < len(lines):
                pos += len(line) + 1
                i += 1
                line = lines[i]
                end = pos + len(line)
            ranges.append((start, end))
        pos += len(line) + 1
        i += 1
    return ranges


def in_directive(ranges, pos):
    return any(a <= pos < b for a, b in ranges)


def split_top(text, base):
    """Splits text at the commas outside (), [], {} and template angle brackets (a
    '<' right after a name opens one). Returns (part, offset) pairs."""
    parts, depth, angle, start = [], 0, 0, 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "<" and depth == 0 and i > 0 and text[i - 1] in IDENT_CHARS:
            angle += 1
        elif ch == ">" and depth == 0 and angle > 0:
            angle -= 1
        elif ch == "," and depth == 0 and angle == 0:
            parts.append((text[start:i], base + start))
            start = i + 1
    parts.append((text[start:], base + start))
    return parts


def matching_close(code, open_pos):
    """Position of the bracket closing the one at open_pos (code is masked)."""
    pairs = {"(": ")", "[": "]", "{": "}"}
    stack = []
    for i in range(open_pos, len(code)):
        ch = code[i]
        if ch in pairs:
            stack.append(pairs[ch])
        elif ch in ")]}":
            if not stack or stack.pop() != ch:
                raise RewriteError(i, "unbalanced '%s'" % ch)
            if not stack:
                return i
    raise RewriteError(open_pos, "no closing bracket for '%s'" % code[open_pos])


def kernel_start(code, end):
    """Start of the kernel expression that ends right before `end` (the '<<<', after
    whitespace): a name, qualified (a::b, a.b, a->b) and possibly a template-id."""
    i = end
    while i > 0 and code[i - 1].isspace():
        i -= 1
    while True:
        if i > 0 and code[i - 1] == ">":
            depth = 0
            j = i - 1
            while j >= 0:
                ch = code[j]
                if ch in ">":
                    depth += 1
                elif ch == "<":
                    depth -= 1
                    if depth == 0:
                        break
                elif ch == ")":
                    # skip a parenthesized template argument, e.g. k<sizeof(T)>
                    d, j2 = 0, j
                    while j2 >= 0:
                        d += code[j2] == ")"
                        d -= code[j2] == "("
                        if d == 0:
                            break
                        j2 -= 1
                    j = j2
                elif ch in ";{}":
                    raise RewriteError(end, "cannot read the launched kernel's template arguments")
                j -= 1
            if j < 0:
                raise RewriteError(end, "cannot read the launched kernel's template arguments")
            i = j
            while i > 0 and code[i - 1].isspace():
                i -= 1
        j = i
        while j > 0 and code[j - 1] in IDENT_CHARS:
            j -= 1
        name = code[j:i]
        if not name or name[0].isdigit() or name in KEYWORDS:
            raise RewriteError(end, "cannot read the launched kernel: expected a name, a "
                               "qualified name, a template-id or a variable before '<<<'")
        i = j
        # a qualifier before the name?
        k = i
        while k > 0 and code[k - 1].isspace():
            k -= 1
        if code[k - 2:k] in ("::", "->"):
            k -= 2
        elif k > 0 and code[k - 1] == ".":
            k -= 1
        else:
            return i
        m = k
        while m > 0 and code[m - 1].isspace():
            m -= 1
        if m > 0 and (code[m - 1] in IDENT_CHARS or code[m - 1] == ">"):
            i = m
            continue
        if code[k:k + 2] == "::":  # ::kernel, the global namespace
            return k
        raise RewriteError(end, "cannot read the launched kernel's qualifier")


def rewrite_launch(src, code, pos):
    """(start, end, replacement) for the launch whose '<<<' is at pos."""
    start = kernel_start(code, pos)
    kernel_text = src[start:pos]
    kernel = " ".join(code[start:pos].split())
    if re.search(r"(?<![\w])a(?![\w])", kernel):
        raise RewriteError(pos, "the launched kernel's expression names 'a', the rewrite's own "
                           "parameter pack: rename it")
    # the configuration: up to the first '>>>' outside brackets
    depth, q = 0, pos + 3
    while q < len(code):
        ch = code[q]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth < 0:
                raise RewriteError(pos, "launch configuration without '>>>'")
        elif ch == ";":
            raise RewriteError(pos, "launch configuration without '>>>'")
        elif depth == 0 and code.startswith(">>>", q):
            break
        q += 1
    else:
        raise RewriteError(pos, "launch configuration without '>>>'")
    config = src[pos + 3:q]
    parts = split_top(code[pos + 3:q], pos + 3)
    if not 2 <= len(parts) <= 4 or any(not p.strip() for p, _ in parts):
        raise RewriteError(pos, "a launch configuration is <<<grid, block[, shared[, "
                           "stream]]>>>; this one has %d part(s)" % len(parts))
    # the arguments
    o = q + 3
    while o < len(code) and code[o].isspace():
        o += 1
    if o >= len(code) or code[o] != "(":
        raise RewriteError(pos, "a launch's '>>>' must be followed by its arguments '(...)'")
    close = matching_close(code, o)
    args = src[o + 1:close]
    defaults = ", 0" * (4 - len(parts))
    lambda_ = "[=](auto... a) { %s(a...); }" % kernel
    # Keep every line where it was: the kernel's own newlines and those before '<<<'
    # go before the configuration, those between '>>>' and '(' before the arguments.
    nl_head = kernel_text.count("\n")
    nl_mid = src[q + 3:o].count("\n")
    out = '::tlemu::launch("%s",%s %s%s, %s' % (kernel, "\n" * nl_head, config, defaults,
                                              lambda_)
    out += "\n" * nl_mid
    if code[o + 1:close].strip():
        out += ", " + args
    else:
        out += args  # only whitespace (its newlines)
    out += ")"
    return start, close + 1, out


SHARED_DECL = re.compile(
    r"^(?P<decl>.*?)(?<![\w])(?P<name>[A-Za-z_]\w*)\s*(?P<dims>(?:\[[^\[\]]*\]\s*)*)$", re.S)


def rewrite_shared(src, code, pos):
    """(start, end, replacement) for the __shared__ declaration at pos."""
    # what comes before it in the statement: nothing but whitespace
    b = pos
    while b > 0 and code[b - 1] not in ";{}":
        b -= 1
    # (directive lines before it, e.g. a #pragma, do not count)
    before = "\n".join(l for l in code[b:pos].split("\n") if not l.lstrip().startswith("#"))
    if re.search(r"\bextern\b", before):
        raise RewriteError(pos, "extern __shared__ (dynamic shared memory) is not supported by "
                           "the emulated build's rewrite")
    if before.strip():
        raise RewriteError(pos, "__shared__ after '%s': only a declaration that starts "
                           "with __shared__ is understood" % " ".join(before.split()))
    semi = code.find(";", pos)
    brace = code.find("{", pos)
    if semi < 0 or (0 <= brace < semi):
        raise RewriteError(pos, "a __shared__ declaration must end with ';' (no initializer, "
                           "no braces)")
    body_code = code[pos + len("__shared__"):semi]
    body = src[pos + len("__shared__"):semi]
    if re.search(r"\bextern\b", body_code):
        raise RewriteError(pos, "extern __shared__ (dynamic shared memory) is not supported by "
                           "the emulated build's rewrite")
    if "=" in body_code:
        raise RewriteError(pos, "a __shared__ declaration with an initializer is not valid CUDA")
    if len(split_top(body_code, 0)) != 1:
        raise RewriteError(pos, "one __shared__ declaration per statement, please: several "
                           "declarators are not understood")
    m = SHARED_DECL.match(body_code)
    if not m or not m.group("decl").strip() or m.group("name") in KEYWORDS:
        raise RewriteError(pos, "cannot read this __shared__ declaration: expected "
                           "__shared__ <attributes> T name[dims];")
    name = m.group("name")
    out = "struct tlemu_shared_%s {%s; }; auto& %s = ::tlemu::block_shared<tlemu_shared_%s>().%s" % (
        name, body, name, name, name)
    return pos, semi, out  # the ';' stays


def rewrite(src, path):
    code = mask_code(src)
    directives = directive_ranges(code)
    edits = []
    for m in re.finditer(r"<<<|(?<![\w])__shared__(?![\w])", code):
        pos = m.start()
        if edits and pos < edits[-1][1]:
            continue  # inside an earlier launch's arguments: see below
        if in_directive(directives, pos):
            raise RewriteError(pos, "'%s' inside a preprocessor directive is not understood"
                               % m.group(0))
        if m.group(0) == "<<<":
            edits.append(rewrite_launch(src, code, pos))
        else:
            edits.append(rewrite_shared(src, code, pos))
        inner = code[edits[-1][0]:edits[-1][1]]
        if m.group(0) == "<<<" and ("<<<" in inner[inner.find("<<<") + 3:]):
            raise RewriteError(pos, "a launch inside a launch's arguments is not understood")
    out, last = [], 0
    for start, end, text in edits:
        out.append(src[last:start])
        out.append(text)
        last = end
    out.append(src[last:])
    result = "".join(out)
    if result.count("\n") != src.count("\n"):
        raise RewriteError(0, "internal error: the rewrite moved lines (%d -> %d)"
                           % (src.count("\n"), result.count("\n")))
    header = ("#line 1 \"%s\"\n" % path.replace("\\", "\\\\").replace('"', '\\"'))
    return header + result


def main(argv):
    if len(argv) not in (3, 4):
        sys.stderr.write("usage: rewrite.py INPUT OUTPUT [LINE_NAME]\n")
        return 2
    source, target = argv[1], argv[2]
    path = os.path.abspath(source)
    line_name = argv[3] if len(argv) == 4 else path
    with open(source, encoding="utf-8") as f:
        src = f.read()
    try:
        text = rewrite(src, line_name)
    except RewriteError as e:
        line = src.count("\n", 0, e.pos) + 1
        sys.stderr.write("%s:%d: error: emulator/rewrite.py: %s\n" % (path, line, e))
        return 1
    try:
        with open(target, encoding="utf-8") as f:
            if f.read() == text:
                return 0
    except OSError:
        pass
    os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
    tmp = target + ".tmp%d" % os.getpid()
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, target)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
