"""Throughput of the sandboxed ``run_python`` tool: tool calls per second at 1 and 2 workers.

The peer, measured in the same run on the same programs, is a bare ``subprocess.run([python, "-c", code])``
with no limit and no isolation: the ratio is what the sandbox costs. Each call runs one small program (a
HumanEval-style function with a few asserts); ``--workers`` calls run at once, as ``PythonTool.run_batch``
runs the calls of a vector env's turn.

    python benchmarks/run_python.py                 # 200 calls per setting
    python benchmarks/run_python.py --calls 50 --site-packages
"""

from __future__ import annotations

import argparse
import concurrent.futures
import subprocess
import sys
import time

from agent_gym.tools.run_python import PythonTool
from agent_gym.tools.sandbox import Sandbox, namespace_command

PROGRAM = """
def has_close_elements(numbers, threshold):
    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])

assert has_close_elements([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3)
assert not has_close_elements([1.0, 2.0, 5.9, 4.0, 5.0], 0.5)
print("ok", {index})
"""


def bare_call(code: str, python: str, site_packages: bool) -> str:
    flags = [] if site_packages else ["-S"]
    return subprocess.run([python, *flags, "-c", code], capture_output=True, text=True, timeout=30).stdout


def calls_per_second(function, calls: int, workers: int) -> float:
    programs = [PROGRAM.format(index=index) for index in range(calls)]
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        outputs = list(pool.map(function, programs))
    elapsed = time.perf_counter() - started
    missing = [index for index, output in enumerate(outputs) if f"ok {index}" not in output]
    if missing:
        raise RuntimeError(f"{len(missing)} calls did not print their result (first: {missing[0]})")
    return calls / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200, help="calls per setting")
    parser.add_argument("--site-packages", action="store_true", help="let programs import installed packages")
    args = parser.parse_args()
    sandbox = Sandbox(site_packages=args.site_packages)
    tool = PythonTool(sandbox, workers=1)
    isolation = sandbox.run("pass").isolation
    print(f"sandbox isolation: {isolation}; namespaces through: {' '.join(namespace_command()) or 'none'}")
    print(f"{args.calls} calls per setting, site packages: {args.site_packages}\n")
    print("| workers | run_python calls/s | bare subprocess calls/s | ratio |")
    print("|---|---|---|---|")
    for workers in (1, 2):
        calls_per_second(lambda code: tool.call({"code": code}).text, 4, workers)  # warm the page cache
        ours = calls_per_second(lambda code: tool.call({"code": code}).text, args.calls, workers)
        bare = calls_per_second(lambda code: bare_call(code, sys.executable, args.site_packages), args.calls, workers)
        print(f"| {workers} | {ours:.1f} | {bare:.1f} | {ours / bare:.2f} |")


if __name__ == "__main__":
    main()
