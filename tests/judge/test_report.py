"""A worker's error as a verdict's reason: a compiler's errors picked out of a build log."""

from __future__ import annotations

from cuda_agent.judge.report import ERROR_SHOWN, describe_error, outcome

COMMAND = ("c++ -MMD -MF main.o.d -DTORCH_EXTENSION_NAME=ext -isystem /venv/torch/include "
           "-isystem /venv/torch/include/torch/csrc/api/include -fPIC -std=c++20 "
           "-c /tmp/torch_extensions/ext/main.cpp -o main.o ")
NINJA_LOG = (f"RuntimeError: Error building extension 'ext': [1/2] {COMMAND}\nFAILED: main.o \n"
             f"{COMMAND}\n/tmp/torch_extensions/ext/main.cpp: In function 'at::Tensor f()':\n"
             + "".join(f"/tmp/torch_extensions/ext/main.cpp:{n}:3: error: expected ';' before "
                       f"'int'\n    {n} |   int broken = ;\n      |   ^~~\n" for n in range(6, 14))
             + "ninja: build stopped: subcommand failed.\n")


def test_compiler_errors_replace_the_build_log():
    said = describe_error(NINJA_LOG)
    assert said.startswith("RuntimeError: Error building extension 'ext': main.cpp:6:3: "
                           "error: expected ';' before 'int'; main.cpp:7:3: error:")
    assert "main.cpp:10:3" in said and "main.cpp:11:3" not in said
    assert said.endswith("; and 3 more error(s)")
    assert "-isystem" not in said


def test_other_errors_are_cut():
    assert describe_error("ValueError: " + "x" * 5000) == ("ValueError: " + "x" * 5000)[
        :ERROR_SHOWN]
    assert describe_error(None) == "None"
    # not a build's log: error-like lines in it stay as they were
    said = "RuntimeError: CUDA error: an illegal memory access\nthreshold: 3, seccomp: on"
    assert describe_error(said) == said


def test_outcome_quotes_the_compiler():
    import json

    done = outcome(json.dumps({"ok": False, "stage": "load", "error": NINJA_LOG}), "load", 0,
                   False, 60.0)
    assert not done.ok and done.failure.startswith("load: RuntimeError: Error building "
                                                   "extension 'ext': main.cpp:6:3: error:")
