from cuda_agent.build.diagnostics import parse, trim_log

GCC = """kernels/a.cpp: In function 'void f()':
kernels/a.cpp:12:5: error: 'y' was not declared in this scope
   12 |     y = 1;
      |     ^
kernels/a.cpp:3:1: warning: unused variable 'z' [-Wunused-variable]
"""

NVCC = """kernels/k.cu(27): error: identifier "blockIdxx" is undefined
      int i = blockIdxx.x;
              ^

1 error detected in the compilation of "kernels/k.cu".
"""

LINK = "/usr/bin/ld: kernels/x.o: in function `f':\nx.cpp:(.text+0x5): undefined reference to `g'\n"


def test_gcc_errors_first_with_line_and_column():
    diags = parse(GCC)
    assert [(d.file, d.line, d.column, d.severity) for d in diags] == [
        ("kernels/a.cpp", 12, 5, "error"), ("kernels/a.cpp", 3, 1, "warning")]
    assert diags[0].message == "'y' was not declared in this scope"
    assert str(diags[0]) == "kernels/a.cpp:12:5: error: 'y' was not declared in this scope"


def test_nvcc_error():
    (diag,) = [d for d in parse(NVCC) if d.file]
    assert (diag.file, diag.line, diag.severity) == ("kernels/k.cu", 27, "error")
    assert diag.message.startswith('identifier "blockIdxx" is undefined')


def test_linker_error_without_file():
    diags = parse(LINK)
    assert any("undefined reference" in d.message and d.file is None for d in diags)


def test_limit_and_trim():
    many = "".join(f"kernels/a.cpp:{i}:1: error: e{i}\n" for i in range(100))
    assert len(parse(many, limit=7)) == 7
    assert len(trim_log("x" * 10_000, limit=1000)) < 1100
