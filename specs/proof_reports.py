#!/usr/bin/env python3
"""Writes the two generated proof reports of specs/ (issue 52); specs/verify.sh runs it after each proof.

  proof_reports.py --srcdir DIR --summary VERIFY-SUMMARY.md --table PROOF-TABLE.md --trusted TRUSTED.md
  proof_reports.py --srcdir DIR --summary VERIFY-SUMMARY.md --check    (compare with DIR/specs/'s reports)

PROOF-TABLE.md classes every function that has an ACSL contract (read from the sources Frama-C parses:
ref/, src/, include/, backend/ and specs/*.acsl) by the convention of specs/README.md: a function in
verify.sh's targets is "value proved" when an ensures clause of its contract is named value_*, "bound
proved" when one is named bound_* (both are possible), else "safety proved"; a function with a contract
that no target lists is "stated only" ("stated only, outside Frama-C's parse" when it sits in an #if branch
of a macro Frama-C's preprocessing leaves undefined: FRAMAC_UNDEFINED).  The goal and smoke-test counts are
those of the summary.
TRUSTED.md lists what the proofs trust without proof: the stated-only contracts, every admit or check
clause, every ACSL axiomatic block, axiom and lemma, each with FILE:LINE and the comment that gives a
reason where one stands right before it.

The sources are read by a parser of the C and ACSL text: comments and strings are told apart; an
annotation (/*@ ... */ or //@, or /@ ... @/ inside a ghost annotation) is a function contract when it has
a requires, ensures, assigns, terminates, decreases, exits or behavior clause and a function declarator
follows it.  Exit status: 0, or 1 with --check when a committed report differs from the generated one.
"""
import argparse
import difflib
import os
import re
import subprocess
import sys

SCANNED_DIRS = ("ref", "src", "include", "backend", "specs")
SCANNED_SUFFIXES = (".c", ".h", ".acsl")
CONTRACT_CLAUSE = re.compile(
    r"(?:^|[;:]|\*/|/\*@|//@|/@)\s*(?:(?:admit|check)\s+)?"
    r"(requires|ensures|assigns|terminates|decreases|exits|behavior|complete\s+behaviors|disjoint\s+behaviors)\b")
LOOP_OR_STATEMENT = re.compile(r"^\s*(?:loop\b|assert\b|ghost\b|for\b|invariant\b|predicate\b|logic\b|lemma\b|"
                               r"axiomatic\b|inductive\b|type\b|global\b|check\s+(?!requires|ensures)|admit\s+"
                               r"(?!requires|ensures))")
DECLARATOR = re.compile(r"^((?:[A-Za-z_]\w*[\s*]+)+?)([A-Za-z_]\w*)\s*\(")
ATTRIBUTE = re.compile(r"__attribute__\s*\(\((?:[^()]|\([^()]*\))*\)\)")
NOT_A_TYPE = {"return", "if", "for", "while", "do", "switch", "case", "goto", "else", "sizeof"}
ENSURES_NAMES = re.compile(r"\bensures\s+((?:[A-Za-z_]\w*\s*:(?!:)\s*)+)")
ADMIT_CHECK = re.compile(r"(?:^|[;{]|/\*@|//@|/@)\s*((?:admit|check)\b[^:;\n]{0,80})", re.M)
AXIOMATIC = re.compile(r"\baxiomatic\s+([A-Za-z_]\w*)\s*\{")
AXIOM_OR_LEMMA = re.compile(r"(?:^|[;{}]|/\*@|//@)\s*(axiom|lemma)\s+([A-Za-z_]\w*)\s*(?:\{[^}]*\}\s*)?(?:<[^>]*>\s*)?:",
                            re.M)


def line_of(text, pos):
    return text.count("\n", 0, pos) + 1


def split_comments(text):
    """Yields (kind, start, end, body) for each comment: kind 'acsl' (/*@, //@) or 'c'; strings skipped."""
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            i = j + 1
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            yield ("acsl" if text.startswith("/*@", i) else "c"), i, j, text[i:j]
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            yield ("acsl" if text.startswith("//@", i) else "c"), i, j, text[i:j]
            i = j
        else:
            i += 1


def acsl_text(body):
    """An annotation without its comment markers and the leading @ of continuation lines."""
    body = re.sub(r"^/\*@|\*/$|^//@|^/@|@/$", "", body)
    return re.sub(r"(?m)^\s*@(?!/)", " ", body)


def collapse(comment):
    body = re.sub(r"^/\*+|\*+/$|^//", "", comment.strip())
    body = re.sub(r"(?m)^\s*\*(?!/)", "", body)
    return " ".join(body.split())


# Macros that ref/gemm/gemm_internal.h leaves undefined when Frama-C preprocesses (MOE_REF_NO_VECTOR under
# __FRAMAC__) and gcc/clang builds define: code in their #if branches is compiled, never read by Frama-C.
FRAMAC_UNDEFINED = ("MOE_HAVE_VECTOR_EXT", "MOE_HAVE_AVX2_KERNEL")
OUTSIDE_PARSE = "outside Frama-C's parse"


def unparsed_macro(text, pos):
    """The macro of FRAMAC_UNDEFINED whose #ifdef / #if defined(...) branch holds pos, or None."""
    stack = []  # per open #if: (macro or None, in its true branch)
    for line in text[:pos].split("\n"):
        d = re.match(r"\s*#\s*(ifdef|ifndef|if|elif|else|endif)\b(.*)", line)
        if not d:
            continue
        kind, cond = d.group(1), d.group(2)
        if kind in ("ifdef", "if"):
            macro = next((m for m in FRAMAC_UNDEFINED
                          if re.search(r"^\s*%s\b|defined\s*\(?\s*%s\b" % (m, m), cond)), None)
            negated = macro is not None and re.search(r"!\s*defined\s*\(?\s*%s\b" % macro, cond)
            stack.append((None if negated else macro, True))
        elif kind == "ifndef":
            stack.append((None, True))
        elif kind in ("elif", "else") and stack:
            stack[-1] = (stack[-1][0], False)
        elif kind == "endif" and stack:
            stack.pop()
    return next((m for m, true_branch in stack if m is not None and true_branch), None)


# Clause macros of ref/moe_ref.h: a clause inside one is in a file's proof only where the file defines the
# macros it needs (MOE_REF_VALUE_CLAUSE: MOE_REF_VALUES; MOE_REF_BOUND_CLAUSE: MOE_REF_VALUES and MOE_REF_BOUNDS).
CLAUSE_MACROS = {"MOE_REF_VALUE_CLAUSE": ("MOE_REF_VALUES",),
                 "MOE_REF_BOUND_CLAUSE": ("MOE_REF_VALUES", "MOE_REF_BOUNDS")}
CLAUSE_MACRO = re.compile(r"\b(%s)\s*\(" % "|".join(CLAUSE_MACROS))


def enclosing_macro(text, pos):
    """The clause macro of CLAUSE_MACROS whose argument list holds pos, or None."""
    found = None
    for m in CLAUSE_MACRO.finditer(text, 0, pos):
        if text.count("(", m.end(), pos) - text.count(")", m.end(), pos) >= 0:
            found = m.group(1)
    return found


class Contract:
    def __init__(self, path, line, name, text, reason, unparsed=None):
        self.path, self.line, self.name, self.text, self.reason = path, line, name, text, reason
        self.unparsed = unparsed
        # (ensures clause name, the clause macro it sits in or None)
        self.named_ensures = [(n.group(0), enclosing_macro(text, g.start()))
                              for g in ENSURES_NAMES.finditer(text)
                              for n in re.finditer(r"[A-Za-z_]\w*", g.group(1))]
        self.ensures = [n for n, _ in self.named_ensures]


def declarator_after(text, pos):
    """The function name declared right after pos (skipping blanks and plain comments), or None."""
    while True:
        m = re.match(r"\s*(/\*(?!@).*?\*/|//(?!@)[^\n]*)", text[pos:], re.S)
        if not m:
            break
        pos += m.end()
    rest = ATTRIBUTE.sub(" ", text[pos:pos + 600]).lstrip()
    m = DECLARATOR.match(rest)
    if not m or re.search(r"[;{}=]", m.group(1)):
        return None
    words = m.group(1).split()
    if not words or words[0] in NOT_A_TYPE or m.group(2) in NOT_A_TYPE:
        return None
    return m.group(2)


def annotations(text):
    """(start, end, body, preceding plain comment) of every annotation, ghost ones' inner /@ @/ included."""
    previous = None
    for kind, start, end, body in split_comments(text):
        if kind == "c":
            previous = (end, body)
            continue
        reason = previous[1] if previous and text[previous[0]:start].strip() == "" else None
        previous = None
        yield start, end, body, reason
        for m in re.finditer(r"/@.*?@/", body, re.S):
            inner_reason = None
            before = body[:m.start()]
            c = re.search(r"(/\*.*?\*/|//[^\n]*)\s*$", before, re.S)
            if c:
                inner_reason = c.group(1)
            yield start + m.start(), start + m.end(), m.group(0), inner_reason


def scan_file(root, rel):
    with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
        text = f.read()
    contracts, trusted_clauses = [], []
    for start, end, body, reason in annotations(text):
        acsl = acsl_text(body)
        is_ghost_block = re.match(r"\s*ghost\b", acsl) is not None
        if not is_ghost_block and not LOOP_OR_STATEMENT.match(acsl) and CONTRACT_CLAUSE.search(acsl):
            name = declarator_after(text, end)
            if name:
                contracts.append(Contract(rel, line_of(text, start), name, acsl,
                                          collapse(reason) if reason else None, unparsed_macro(text, start)))
        if body.startswith("/@"):
            continue  # the ghost block's own text was scanned as a whole
        outer = re.sub(r"/@.*?@/", lambda m: "\n" * m.group(0).count("\n"), acsl, flags=re.S)
        for m in ADMIT_CHECK.finditer(outer):
            what = " ".join(m.group(1).split())
            trusted_clauses.append((rel, line_of(text, start) + outer.count("\n", 0, m.start(1)), what,
                                    collapse(reason) if reason else None))
        for m in AXIOMATIC.finditer(outer):
            trusted_clauses.append((rel, line_of(text, start) + outer.count("\n", 0, m.start()),
                                    "axiomatic " + m.group(1), collapse(reason) if reason else None))
        for m in AXIOM_OR_LEMMA.finditer(outer):
            trusted_clauses.append((rel, line_of(text, start) + outer.count("\n", 0, m.start(1)),
                                    m.group(1) + " " + m.group(2), collapse(reason) if reason else None))
    return contracts, trusted_clauses


def source_files(root):
    for top in SCANNED_DIRS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames[:] = sorted(d for d in dirnames if d != "wp")
            for name in sorted(filenames):
                if name.endswith(SCANNED_SUFFIXES):
                    yield os.path.relpath(os.path.join(dirpath, name), root)


def read_targets(root):
    out = subprocess.run(["sh", os.path.join(root, "specs", "verify.sh"), "--targets"], check=True,
                         stdout=subprocess.PIPE, universal_newlines=True).stdout
    targets = []
    for line in out.split():
        path, _, fcts = line.partition(":")
        targets += [(path, f) for f in fcts.split(",") if f]
    return targets


def read_summary(path):
    """{(file, function): (goals proved/total, smoke passed/total or None)} from a VERIFY-SUMMARY.md."""
    rows = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) >= 3 and re.match(r"^\d+ / \d+", cells[2]):
                smoke = cells[3] if len(cells) > 3 and re.match(r"^\d+ / \d+", cells[3]) else None
                rows[(cells[0], cells[1])] = (cells[2], smoke)
    return rows


def file_defines(root, path):
    """The macros path defines at a line's start (#define NAME), as specs/verify.sh tests MOE_REF_VALUES."""
    try:
        with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
            return set(re.findall(r"(?m)^#define\s+([A-Za-z_]\w*)", f.read()))
    except OSError:
        return set()


def classify(contracts, defines=None):
    """The class of a target from its contracts' ensures names; with defines (the macros its file defines), a
    clause inside a clause macro counts only where the file enables it (it is absent from that file's proof)."""
    names = [n for c in contracts for n, macro in c.named_ensures
             if macro is None or defines is None or all(d in defines for d in CLAUSE_MACROS[macro])]
    kinds = [k for k, prefix in (("value proved", "value_"), ("bound proved", "bound_"))
             if any(n.startswith(prefix) for n in names)]
    return ", ".join(kinds) if kinds else "safety proved"


def build(root, summary_path):
    contracts, clauses = [], []
    for rel in source_files(root):
        c, t = scan_file(root, rel)
        contracts += c
        clauses += t
    targets = read_targets(root)
    summary = read_summary(summary_path)
    target_names = {f for _, f in targets}
    by_file = {}
    for c in contracts:
        by_file.setdefault((c.path, c.name), []).append(c)
    headers = {}
    for c in contracts:
        if not c.path.endswith(".c"):
            headers.setdefault(c.name, []).append(c)

    rows = []
    for path, fct in sorted(set(targets)):
        own = by_file.get((path, fct)) or headers.get(fct, [])
        goals, smoke = summary.get((path, fct), ("no result in the summary", None))
        cls = classify(own, file_defines(root, path)) if own else "safety proved (no contract: run-time errors only)"
        rows.append((path, fct, cls, goals, smoke or "-"))
    stated = []
    for c in contracts:
        proved_here = (c.path, c.name) in set(targets) or (not c.path.endswith(".c") and c.name in target_names)
        if not proved_here:
            stated.append(c)
    seen = set()
    stated_rows = []
    for c in sorted(stated, key=lambda c: (c.name, c.path, c.line)):
        if c.name in seen and not c.path.endswith(".c"):
            continue
        seen.add(c.name)
        stated_rows.append(c)

    table = ["# Proved and stated contracts, per function (generated by specs/proof_reports.py; do not edit)", "",
             "Classes (specs/README.md): a function of specs/verify.sh's targets is *value proved* when its contract",
             "has an ensures clause named `value_*`, *bound proved* when one is named `bound_*`, else *safety",
             "proved* (its contract and every run-time-error assertion proved, whatever the contract states); a",
             "function with a contract that no target lists is *stated only* (TRUSTED.md). Counts: VERIFY-SUMMARY.md.",
             ""]
    counts = {}
    for r in rows:
        counts.setdefault(r[2], []).append(r)
    table += ["| class | functions |", "|---|---|"]
    for cls in sorted(counts):
        table.append("| %s | %d |" % (cls, len(counts[cls])))
    unparsed = [c for c in stated_rows if c.unparsed]
    table.append("| stated only | %d |" % (len(stated_rows) - len(unparsed)))
    if unparsed:
        table.append("| stated only, %s | %d |" % (OUTSIDE_PARSE, len(unparsed)))
    table += ["", "| file | function | class | goals proved / total | smoke tests passed / total |", "|---|---|---|---|---|"]
    table += ["| %s | %s | %s | %s | %s |" % r for r in rows]
    table += ["| %s:%d | %s | stated only%s | - | - |" % (c.path, c.line, c.name,
                                                         ", %s (%s)" % (OUTSIDE_PARSE, c.unparsed) if c.unparsed else "")
              for c in sorted(stated_rows, key=lambda c: (c.path, c.line))]
    if unparsed:
        table += ["", "*Stated only, %s*: the function is compiled by gcc and clang only (the macro in" % OUTSIDE_PARSE,
                  "parentheses), never under Frama-C, which reads the scalar path instead; its contract is not checked",
                  "at all, and the function is tested bit for bit against the naive twin (specs/README.md)."]

    trusted = ["# What the proofs trust without proof (generated by specs/proof_reports.py; do not edit)", "",
               "Every function below has an ACSL contract that no run of specs/verify.sh proves: WP uses it at",
               "each call site of a proved function as it is stated.  Then every admit or check clause (WP assumes",
               "an admit clause and does not let later goals use a check clause), every axiomatic block, axiom and",
               "ACSL lemma (the run proves functions, -wp-fct, not lemmas).  The reason is the comment right",
               "before the contract, where there is one; specs/README.md says what tests each instead.", "",
               "## Stated-only contracts (%d)" % len(stated_rows), ""]
    for c in sorted(stated_rows, key=lambda c: (c.path, c.line)):
        where = "%s:%d%s" % (c.path, c.line, ", %s: %s" % (OUTSIDE_PARSE, c.unparsed) if c.unparsed else "")
        trusted.append("- `%s` (%s)%s" % (c.name, where, ": " + c.reason if c.reason else ""))
    trusted += ["", "## admit and check clauses, axiomatic blocks, axioms and lemmas (%d)" % len(clauses), ""]
    if clauses:
        for path, line, what, reason in sorted(clauses):
            trusted.append("- %s (%s:%d)%s" % (what, path, line, ": " + reason if reason else ""))
    else:
        trusted.append("None.")
    return "\n".join(table) + "\n", "\n".join(trusted) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--srcdir", required=True)
    ap.add_argument("--summary", required=True, help="the VERIFY-SUMMARY.md whose counts the table shows")
    ap.add_argument("--table", help="where PROOF-TABLE.md goes")
    ap.add_argument("--trusted", help="where TRUSTED.md goes")
    ap.add_argument("--check", action="store_true", help="compare with SRCDIR/specs/PROOF-TABLE.md, TRUSTED.md")
    args = ap.parse_args()
    if not os.path.isfile(args.summary):
        sys.exit("proof_reports.py: --summary %s: no such file" % args.summary)
    table, trusted = build(args.srcdir, args.summary)
    if args.check:
        stale = 0
        for name, text in (("PROOF-TABLE.md", table), ("TRUSTED.md", trusted)):
            path = os.path.join(args.srcdir, "specs", name)
            old = open(path, encoding="utf-8").read() if os.path.isfile(path) else ""
            if old != text:
                stale = 1
                sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), text.splitlines(True),
                                                           path, "generated"))
                print("proof_reports.py: %s is stale (make proof-reports rewrites it)" % path)
        return stale
    for path, text in ((args.table, table), (args.trusted, trusted)):
        if path:
            tmp = path + ".tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
