"""Mutation score of the CPU test suite (issue 8), measured with mutmut (PyPI), not in CI.

mutmut's configuration is ``[tool.mutmut]`` in pyproject.toml (what is mutated: ``passes/``,
``ir/``, ``onnx/``, ``targets/common/``, ``runtime/``). Every mutant is generated; a uniform
random sample of them (fixed seed) is run, because the whole set (about 5,100 mutants, each
running the tests that reach its function) takes far longer than a session on a 2-core host.

    mutmut run --max-children 2 NONEXISTENT   # generate mutants and collect test stats once
    python benchmarks/mutation/mutation.py sample 400 > /tmp/names   # the sample (seed 0)
    mutmut run --max-children 2 $(cat /tmp/names)
    python benchmarks/mutation/mutation.py collect /tmp/names        # -> results.json

``collect`` reads mutmut's verdicts from ``mutants/**/*.meta`` and the triage of survivors
from ``triage.json`` (mutant name -> [verdict, why]: "equivalent", "gpu-only", "gap, fixed").
Run it right after the sample's run: once the code changes, mutmut renumbers the mutants of
changed files and re-runs replace the verdicts. results.json is the state after the sample's run,
before the fixes.
"""

from __future__ import annotations

import functools
import json
import math
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
MUTANTS = ROOT / "mutants"


def _all() -> dict[str, int | None]:
    codes: dict[str, int | None] = {}
    for meta in sorted(MUTANTS.rglob("*.py.meta")):
        codes.update(json.loads(meta.read_text())["exit_code_by_key"])
    return codes


def sample(n: int, seed: int = 0, since: str | None = None, until: str = "HEAD",
           added_lines: bool = False) -> list[str]:
    """``n`` mutants drawn uniformly (``seed``); with ``since`` (a date or commit) only from
    functions with a line added or changed from then to ``until`` (``git diff`` of the sources);
    with ``added_lines`` also only mutants of such a line (a change that touches a long function
    in one line: its other mutants say nothing of the change, and each may run a thousand tests)."""
    names = sorted(_all())
    if since is not None:
        touched = _touched_functions(since, until)
        names = [m for m in names if _function_of(m) in touched]
        if added_lines:
            added = _added_lines(since, until)
            names = [m for m in names if set(_mutated_lines(m)) & added]
    return sorted(random.Random(seed).sample(names, min(n, len(names))))


def _added_lines(since: str, until: str) -> set[str]:
    """The text (stripped) of every line of src/*.py added from ``since`` to ``until``."""
    diff = subprocess.run(["git", "diff", "-U0", since, until, "--", "src"], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout
    out, path = set(), None
    for line in diff.splitlines():
        if line.startswith("+++ "):
            path = line[6:]
        elif line.startswith("+") and path and path.endswith(".py") and line[1:].strip():
            out.add(line[1:].strip())
    return out


def _mutated_lines(name: str) -> list[str]:
    """The original lines (stripped) a mutant changes: its function's text against the original's
    in mutmut's generated file (what ``mutmut show`` prints, without a process per mutant)."""
    import difflib

    module, _, fn = name.rpartition(".")
    functions = _mutant_functions(module)
    original = functions.get(fn.rsplit("__mutmut_", 1)[0] + "__mutmut_orig", [])
    mutant = functions.get(fn, [])
    return [l[1:].strip() for l in difflib.unified_diff(original[1:], mutant[1:], lineterm="", n=0)
            if l.startswith("-") and not l.startswith("---")]


@functools.cache
def _mutant_functions(module: str) -> dict[str, list[str]]:
    """Every function (methods too) of mutmut's copy of ``module``: name -> its lines."""
    import ast

    path = MUTANTS / "src" / (module.replace(".", "/") + ".py")
    if not path.exists():
        path = path.with_suffix("") / "__init__.py"
    text = path.read_text()
    lines = text.splitlines()
    out = {}
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and "__mutmut_" in node.name:
            out[node.name] = lines[node.lineno - 1:node.end_lineno]
    return out


def _function_of(name: str) -> tuple[str, str]:
    """mutmut's ``pkg.mod.xǁClassǁmethod__mutmut_3`` / ``pkg.mod.x_func__mutmut_3`` ->
    (module, 'Class.method' / 'func')."""
    module, _, rest = name.partition(".x")
    rest = rest.rsplit("__mutmut_", 1)[0]
    if rest.startswith("ǁ"):
        return module, ".".join(p for p in rest.split("ǁ") if p)
    return module, rest.removeprefix("_")


def _touched_functions(since: str, until: str = "HEAD") -> set[tuple[str, str]]:
    """(module, qualified function) of every function of src/ with an added line from ``since``
    to ``until`` (commits; the sources are read as ``until`` has them)."""
    import ast
    import re

    base = since
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}", since):  # a date: the last commit before it
        base = subprocess.run(["git", "rev-list", "-1", f"--before={since} 00:00", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout.strip()
    diff = subprocess.run(["git", "diff", "-U0", base, until, "--", "src"], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout
    added: dict[str, set[int]] = {}
    path = None
    for line in diff.splitlines():
        if line.startswith("+++ "):
            path = line[6:] if line.startswith("+++ b/") else None
        elif line.startswith("@@") and path and path.endswith(".py"):
            m = re.search(r"\+(\d+)(?:,(\d+))?", line)
            start, count = int(m.group(1)), int(m.group(2) or 1)
            added.setdefault(path, set()).update(range(start, start + count))
    touched = set()
    for path, lines in added.items():
        module = path.removeprefix("src/").removesuffix(".py").replace("/", ".").removesuffix(".__init__")
        tree = ast.parse(subprocess.run(["git", "show", f"{until}:{path}"], cwd=ROOT, capture_output=True,
                                        text=True, check=True).stdout)
        for node, owner in _functions(tree):
            if lines & set(range(node.lineno, node.end_lineno + 1)):
                touched.add((module, f"{owner}.{node.name}" if owner else node.name))
    return touched


def _functions(tree):
    import ast

    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node, ""
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield item, node.name


def _status(code: int | None) -> str:
    from mutmut.__main__ import status_by_exit_code

    return status_by_exit_code[code]


def _module_of(name: str) -> str:
    return name.split(".x", 1)[0]  # mutmut's names: <module>.x_<function>__mutmut_<n>


_PYTEST = """
import sys, pytest
tests = open(sys.argv[1]).read().split("\\n")
sys.exit(pytest.main(["-x", "-q", "-p", "no:randomly", "-p", "no:cacheprovider", *tests]))
"""


def run(names_file: Path, jobs: int = 2, timeout: int = 900) -> dict[str, int]:
    """Each mutant of ``names_file`` against the tests mutmut's stats say reach its function
    (fastest first, stopping at the first failure), in a fresh process per mutant: mutmut's own
    ``run`` without its fork server. Exit codes (mutmut's: 1 killed, 0 survived, 33 no tests, 36
    timeout) go into mutmut's ``.meta`` files, so ``collect`` and ``mutmut results`` read them."""
    import concurrent.futures
    import os
    import tempfile

    stats = json.loads((MUTANTS / "mutmut-stats.json").read_text())
    tests_of, duration = stats["tests_by_mangled_function_name"], stats["duration_by_test"]
    names = [n for n in names_file.read_text().split() if n]

    def one(name: str) -> tuple[str, int]:
        tests = sorted(tests_of.get(name.rsplit("__mutmut_", 1)[0], []), key=lambda t: duration.get(t, 0))
        if not tests:
            return name, 33
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as listing:
            listing.write("\n".join(tests))
        env = {**os.environ, "MUTANT_UNDER_TEST": name, "PYTHONPATH": str(MUTANTS / "src")}
        try:
            code = subprocess.run([sys.executable, "-c", _PYTEST, listing.name], cwd=MUTANTS, env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            code = 36
        finally:
            os.unlink(listing.name)
        print(f"{name}: {_status(code)}", flush=True)
        return name, code

    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        codes = dict(pool.map(one, names))
    for meta_path in MUTANTS.rglob("*.py.meta"):
        meta = json.loads(meta_path.read_text())
        mine = {n: c for n, c in codes.items() if n in meta["exit_code_by_key"]}
        if mine:
            meta["exit_code_by_key"].update(mine)
            meta_path.write_text(json.dumps(meta))
    return codes


# verdicts of a survivor some test catches: one added after the run, the mutant applied by hand
# (mutmut could not activate it), or a test of the long set (mutmut's stats ran the fast set)
_CAUGHT = ("gap, fixed", "killed by hand", "killed by the long set")


def collect(names_file: Path) -> dict:
    codes = _all()
    names = [n for n in names_file.read_text().split() if n]
    triage = json.loads((HERE / "triage.json").read_text()) if (HERE / "triage.json").exists() else {}
    status = {n: _status(codes.get(n)) for n in names}
    counts = Counter(status.values())
    run = [n for n in names if status[n] in ("killed", "survived", "timeout", "segfault", "suspicious")]
    killed = [n for n in run if status[n] in ("killed", "timeout", "segfault")]
    survivors = [n for n in run if status[n] in ("survived", "suspicious")]
    no_tests = [n for n in names if status[n] == "no tests"]
    verdict = {n: triage.get(n, ["untriaged"])[0] for n in survivors}
    equivalent = [n for n in survivors if verdict[n] == "equivalent"]
    fixed = [n for n in survivors if verdict[n] in _CAUGHT]
    not_run = [n for n in names if status[n] == "not checked"]
    measured = [n for n in names if status[n] != "not checked"]

    def score(k: int, total: int) -> dict:
        p = k / total if total else float("nan")
        half = 1.96 * math.sqrt(p * (1 - p) / total) if total else float("nan")
        return {"killed": k, "of": total, "fraction": round(p, 4),
                "ci95": [round(max(0.0, p - half), 4), round(min(1.0, p + half), 4)]}

    # no CPU test reaches it: the ORT session code (GPU only), or a gap the triage names
    no_tests_fixed = [n for n in no_tests if triage.get(n, [""])[0] in _CAUGHT]
    no_tests_equivalent = [n for n in no_tests if triage.get(n, [""])[0] == "equivalent"]
    gpu_only = [n for n in survivors + no_tests if triage.get(n, [""])[0] == "gpu-only"]
    equivalent = equivalent + no_tests_equivalent
    fixed = fixed + no_tests_fixed
    diffs = {}
    for n in survivors + no_tests:
        proc = subprocess.run([sys.executable, "-m", "mutmut", "show", n], capture_output=True,
                              text=True, cwd=ROOT)
        diffs[n] = "\n".join(l for l in proc.stdout.splitlines()
                             if l.startswith(("+", "-")) and not l.startswith(("+++", "---")))
    by_file = Counter(_module_of(n) for n in names)
    return {
        "tool": "mutmut " + __import__("mutmut").__version__,
        "generated": len(codes), "sampled": len(names), "sample_seed": 0,
        "sample_rule": "uniform over the mutants of the functions a change touched "
                       "(mutation.py sample N SEED --since C --until C2; see the README)",
        "statuses": dict(counts),
        # measured: every sampled mutant that got a verdict; "no tests" (no CPU test reaches the
        # function: GPU-only code) counts as not killed
        "score": score(len(killed), len(measured)),
        "score_equivalent_removed": score(len(killed), len(measured) - len(equivalent)),
        "score_with_followup_tests": score(len(killed) + len(fixed), len(measured) - len(equivalent)),
        # the same without the mutants only a GPU (or a running server) reaches: what the CPU
        # suite can be asked to catch (tests/gpu covers the rest on the GPU host)
        "score_cpu_reachable": score(len(killed) + len(fixed),
                                     len(measured) - len(equivalent) - len(gpu_only)),
        "gpu_only": gpu_only,
        "followup_note": "survivors triaged 'gap, fixed' are killed by tests added after the run "
                         "(re-run by mutmut: see rerun in the README); 'killed by hand': mutmut "
                         "could not activate the mutant (code run while tests are collected), "
                         "applied by hand the named test fails (see triage.json)",
        "not_run": not_run,
        "sampled_by_module": dict(sorted(by_file.items())),
        "survivors": [{"name": n, "diff": diffs[n], "triage": triage.get(n, ["untriaged", ""])}
                      for n in survivors],
        "no_tests": [{"name": n, "diff": diffs[n], "triage": triage.get(n, ["untriaged", ""])}
                     for n in no_tests],
    }


if __name__ == "__main__":
    if sys.argv[1] == "sample":  # sample N [SEED] [--since DATE|COMMIT] [--until COMMIT] [--added-lines]
        args = [a for a in sys.argv[2:] if a != "--added-lines"]
        flags = {f: args[args.index(f) + 1] for f in ("--since", "--until") if f in args}
        plain = [a for i, a in enumerate(args) if a not in flags and a not in flags.values()]
        print("\n".join(sample(int(plain[0]), int(plain[1]) if len(plain) > 1 else 0,
                               flags.get("--since"), flags.get("--until", "HEAD"),
                               "--added-lines" in sys.argv)))
    elif sys.argv[1] == "run":  # run NAMES [--timeout S]: each mutant in a process of its own (see run)
        args = sys.argv[2:]
        run(Path(args[0]), timeout=int(args[args.index("--timeout") + 1]) if "--timeout" in args else 900)
    elif sys.argv[1] == "collect":  # collect NAMES [OUT.json]
        result = collect(Path(sys.argv[2]))
        out = Path(sys.argv[3]) if len(sys.argv) > 3 else HERE / "results.json"
        out.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
        print(json.dumps({k: v for k, v in result.items() if k.startswith(("score", "statuses"))}, indent=1))
        print("survivors:", {n["name"]: n["triage"][0] for n in result["survivors"]})
