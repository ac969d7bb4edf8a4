"""The packaged ``code-edit`` suite: bug-fix prompts made from HumanEval by
``benchmarks/make_code_edit.py`` (chat-templated, one injected bug per program, reproducible)."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from collections import Counter


from specgraft.suites import DATA_DIR, SUITES, load_suite

from tests.helpers.scripts import ROOT, benchmark_script

SCRIPT = ROOT / "benchmarks" / "make_code_edit.py"
FILE = DATA_DIR / "code_edit.jsonl"
CODE_BLOCK = re.compile(r"```python\n(.*?)```", re.S)
INSTRUCTION = "Fix the bug in this Python function. Reply with the complete corrected function only.\n\n"


def _records() -> list[dict]:
    return [json.loads(line) for line in FILE.read_text(encoding="utf-8").splitlines()]


def _humaneval() -> dict[str, dict]:
    return {r["id"]: r for r in map(json.loads, (DATA_DIR / SUITES["humaneval"]).read_text(encoding="utf-8").splitlines())}


def _buggy(rec: dict) -> str:
    blocks = CODE_BLOCK.findall(rec["turns"][0])
    assert len(blocks) == 1, rec["id"]
    return blocks[0]


def test_suite_loads_chat_templated():
    assert SUITES["code-edit"] == "code_edit.jsonl"
    suite = load_suite("code-edit")
    assert len(suite.prompts) == 40 and suite.tasks == ["code_edit"]
    assert len({p.id for p in suite.prompts}) == 40
    assert all(p.id.startswith("code_edit-") and p.suite == "code-edit" for p in suite.prompts)
    # chat template like spec-bench, not raw completion like humaneval
    assert all(p.chat for p in suite.prompts) and all(len(p.turns) == 1 for p in suite.prompts)
    six = load_suite("code-edit:6")
    assert [p.id for p in six.prompts] == [p.id for p in suite.prompts[:6]]
    assert [p.id for p in load_suite("code-edit", per_task=3).prompts] == [p.id for p in suite.prompts[:3]]
    both = load_suite("humaneval:2,code-edit:2")
    assert [p.chat for p in both.prompts] == [False, False, True, True]


def test_prompts_hold_one_parsing_bug_each():
    he = _humaneval()
    kinds = Counter()
    for rec in _records():
        n = rec["id"].removeprefix("code_edit-")
        src = he[f"HumanEval/{n}"]
        assert rec["task"] == "code_edit" and rec["source_id"] == src["id"] and rec["entry_point"] == src["entry_point"]
        assert rec["turns"][0].startswith(INSTRUCTION) and rec["turns"][0].endswith("```")
        buggy = _buggy(rec)
        ast.parse(buggy)
        ast.parse(rec["reference"])
        assert rec["reference"] == (src["turns"][0] + src["canonical_solution"]).rstrip() + "\n"
        # exactly one line differs, inside the canonical solution
        old, new = rec["reference"].splitlines(), buggy.splitlines()
        assert len(old) == len(new)
        diff = [i for i, (a, b) in enumerate(zip(old, new)) if a != b]
        assert len(diff) == 1 and diff[0] >= src["turns"][0].count("\n"), rec["id"]
        # a small edit: the answer is a copy of the input but for a few characters
        a, b = rec["reference"], buggy
        pre = len(os.path.commonprefix([a, b]))
        suf = len(os.path.commonprefix([a[pre:][::-1], b[pre:][::-1]]))
        assert max(len(a), len(b)) - pre - suf <= 12, rec["id"]
        assert rec["mutation"].startswith(rec["mutation_type"] + ": ")
        kinds[rec["mutation_type"]] += 1
    assert set(kinds) == {"comparison", "and_or", "return_bool", "plus_minus", "remove_not", "off_by_one"}
    assert min(kinds.values()) >= 3


def test_bugs_break_humaneval_tests():
    """The stored bug makes HumanEval's check fail; the reference passes (a few items, in subprocesses)."""
    gen = benchmark_script("make_code_edit")
    he = _humaneval()
    for rec in _records()[:3]:
        src = he[rec["source_id"]]
        assert gen.run_check(rec["reference"], src["test"], src["entry_point"]) == "pass"
        assert gen.run_check(_buggy(rec), src["test"], src["entry_point"]) == "fail"


def test_mutation_kinds():
    gen = benchmark_script("make_code_edit")
    prog = (
        "def f(s, n):\n"
        "    '''doc: a < b and not c'''\n"
        "    if not s or n is not None and n < 0:\n"
        "        return True\n"
        "    for i in range(len(s) - 2):\n"
        "        t = 'x' + s[i] + str(n)\n"
        "    return s[0] + n\n"
    )
    muts = gen.candidate_mutations(prog, 3)
    got = {(m.kind, m.apply(prog).splitlines()[m.line - 1].strip()) for m in muts}
    for m in muts:
        ast.parse(m.apply(prog))
        assert m.line >= 3  # never in the signature or docstring
    assert ("remove_not", "if s or n is not None and n < 0:") in got
    assert ("remove_not", "if not s or n is None and n < 0:") in got
    assert ("and_or", "if not s and n is not None and n < 0:") in got
    assert ("comparison", "if not s or n is not None and n <= 0:") in got
    assert ("return_bool", "return False") in got
    assert ("off_by_one", "for i in range(len(s) - 1):") in got
    assert ("off_by_one", "for i in range(len(s) - 3):") in got
    assert ("off_by_one", "return s[1] + n") in got
    assert ("plus_minus", "return s[0] - n") in got
    # `+` on strings is never turned into `-`
    assert not any(k == "plus_minus" and line.startswith("t =") for k, line in got)


def test_generator_reproduces_the_file(tmp_path):
    out = tmp_path / "code_edit.jsonl"
    r = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--jobs", "4"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == FILE.read_bytes()


def test_generator_no_check_is_fast_and_well_formed(tmp_path):
    gen = benchmark_script("make_code_edit")
    records, _ = gen.build(check=False)
    assert len(records) == 40 and len({r["id"] for r in records}) == 40
    for rec in records:
        ast.parse(_buggy(rec))
    # same selection rule: the file's ids all come from the stride-4 order
    order = [f"code_edit-{i}" for i in gen.selection_order(164)]
    ids = [r["id"] for r in _records()]
    assert ids == sorted(ids, key=order.index)
