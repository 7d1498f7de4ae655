"""The command line: output of explain / zoo, and exit codes that tell bad input (2)
from internal errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper
import pytest
from onnx import TensorProto, helper

from polytile import cli, zoo
from polytile.codegen.configs import default_config
from polytile.codegen.target import host
from polytile.errors import InputError
from polytile.explanation import explain
from polytile.poly.default.schedule import default_schedule
from polytile.poly.ir.schedule import initial_schedule
from polytile.search.records import Record, RecordFile
from polytile.search.tasks import extract_tasks


def write_model(path: Path, op: str = "Relu", shape: list | None = None) -> Path:
    graph = helper.make_graph(
        [helper.make_node(op, ["x"], ["y"])],
        "m",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape or [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_pt_explain_stays_the_function_once_the_cli_imported_its_module() -> None:
    """The CLI imports the module behind `pt.explain`; a module of the same name would then
    shadow the function on the package (`pt.explain(model)` calling a module)."""
    import polytile as pt
    import polytile.explanation

    assert pt.explain is polytile.explanation.explain


def test_explain_file_with_groups_and_verify(tmp_path: Path, capsys) -> None:
    path = write_model(tmp_path / "relu.onnx")
    assert cli.main(["explain", str(path), "--groups", "--verify"]) == 0
    out = capsys.readouterr().out
    assert "fold_constants" in out and "1 groups" in out and "matches the original" in out


def test_explain_zoo_model(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cli.main(["explain", "mlp", "--verify"]) == 0
    assert "Gemm" in capsys.readouterr().out


def test_explain_a_model_with_symbolic_sizes(tmp_path: Path, capsys) -> None:
    """Its kernels as compile makes them for all sizes; --verify needs static shapes."""
    path = write_model(tmp_path / "dyn.onnx", shape=["n", 3])
    assert cli.main(["explain", str(path), "--kernel", "0"]) == 0
    out = capsys.readouterr().out
    assert "sizes ('n',)" in out and "i0 < n" in out
    assert cli.main(["explain", str(path), "--verify"]) == cli.EXIT_BAD_INPUT
    assert "--input-shapes" in capsys.readouterr().err
    assert cli.main(["explain", str(path), "--input-shapes", "x:[4,3]", "--verify"]) == 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["explain", "no-such-model"], "neither a model file nor a zoo model"),
        (["explain", "/missing/model.onnx"], "does not exist"),
    ],
)
def test_bad_input_exit_code(argv: list[str], message: str, capsys) -> None:
    assert cli.main(argv) == cli.EXIT_BAD_INPUT
    assert message in capsys.readouterr().err


def test_unsupported_op_exit_code(tmp_path: Path, capsys) -> None:
    path = write_model(tmp_path / "det.onnx", op="Det")
    assert cli.main(["explain", str(path)]) == cli.EXIT_BAD_INPUT
    assert "Det" in capsys.readouterr().err


def test_internal_error_exit_code(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr("polytile.frontend.partition", boom)
    path = write_model(tmp_path / "relu.onnx")
    assert cli.main(["explain", str(path)]) == cli.EXIT_INTERNAL


def test_zoo_list(capsys) -> None:
    assert cli.main(["zoo", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(zoo.NAMES)
    by_name = {line.split()[0]: line for line in lines}
    assert "onnx-light" in by_name["resnet50"] and "generated" in by_name["transformer"]
    assert "modern" in by_name["llama_small"]
    assert "input_ids[batch,seq]" in by_name["bert_small__dyn"]
    assert "int8" in by_name["resnet34__qdq"]


def test_parse_input_shapes() -> None:
    assert cli.parse_input_shapes("a:[1,3] b:[2]") == {"a": (1, 3), "b": (2,)}
    assert cli.parse_input_shapes("ids:[batch,seq]") == {"ids": ("batch", "seq")}
    with pytest.raises(InputError, match="name:"):
        cli.parse_input_shapes("a=[1,3]")
    with pytest.raises(InputError, match="name:"):
        cli.parse_input_shapes("a:[1,-3]")
    assert cli.parse_sizes("seq=1:512, batch=4", "--bounds") == {"seq": (1, 512), "batch": (4,)}
    with pytest.raises(InputError, match="--sizes item 'seq:4'"):
        cli.parse_sizes("seq:4", "--sizes")


def test_run_a_model_compiled_for_all_sizes(tmp_path: Path, capsys) -> None:
    """A symbolic size stays symbolic: one compile, run at the sizes --sizes gives."""
    path = write_model(tmp_path / "dyn.onnx", op="Softmax", shape=["n", 3])
    out = tmp_path / "dyn.ptm"
    assert cli.main(["compile", str(path), "-o", str(out)]) == 0
    for n in ("2", "5"):
        assert cli.main(["run", str(out), "--sizes", f"n={n}"]) == 0
        assert f"[{n}, 3]" in capsys.readouterr().out


def test_compile_then_run_a_saved_model(tmp_path: Path, capsys) -> None:
    import numpy as np

    path = write_model(tmp_path / "relu.onnx")
    saved = tmp_path / "relu.ptm"
    assert cli.main(["compile", str(path), "-o", str(saved)]) == 0
    assert (saved / "manifest.json").exists()
    x = np.array([[-1, 2, -3], [4, -5, 6]], dtype=np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    out = tmp_path / "out.npz"
    argv = ["run", str(saved), "-i", str(tmp_path / "in.npz"), "-o", str(out), "--repeat", "3"]
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    assert "output y: float32[2, 3]" in text and "mean" in text and "median" in text
    with np.load(out) as data:
        np.testing.assert_array_equal(data["y"], np.maximum(x, 0))


def test_run_reads_bfloat16_inputs_from_npz(tmp_path: Path) -> None:
    """numpy saves a bfloat16 array as raw 2-byte records; run reads it back as one."""
    import ml_dtypes
    import numpy as np

    path = tmp_path / "relu16.onnx"
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "m",
        [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, None)],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    x = np.array([[-1.5, 2, -3], [4, -5, 6.25]], dtype=ml_dtypes.bfloat16)
    np.savez(tmp_path / "in.npz", x=x)
    out = tmp_path / "out.npz"
    assert cli.main(["run", str(path), "-i", str(tmp_path / "in.npz"), "-o", str(out)]) == 0
    with np.load(out) as data:
        y = data["y"].view(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(y.astype(np.float32), np.maximum(x.astype(np.float32), 0))


def test_run_profiles_the_kernel_calls(tmp_path: Path, capsys) -> None:
    path = write_model(tmp_path / "relu.onnx")
    assert cli.main(["run", str(path), "--profile", "3"]) == 0
    text = capsys.readouterr().out
    assert "profile: 1 kernel calls" in text and "100.0%" in text
    assert cli.main(["run", str(path), "--profile", "-1"]) == cli.EXIT_BAD_INPUT
    assert "repeat must be at least 1" in capsys.readouterr().err


def test_bench_compares_with_onnxruntime(tmp_path: Path, capsys) -> None:
    path = write_model(tmp_path / "tanh.onnx", op="Tanh", shape=[4, 37])
    assert cli.main(["bench", str(path), "--repeat", "3", "--threads", "1"]) == 0
    text = capsys.readouterr().out
    assert "against onnxruntime" in text and "polytile / onnxruntime latency" in text


def test_compile_zoo_batch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    out = tmp_path / "compiled"
    assert cli.main(["compile", "--zoo", "mlp", "-o", str(out)]) == 0
    assert (out / "mlp.ptm" / "manifest.json").exists()
    assert cli.main(["compile", "--zoo", "nosuch", "-o", str(out)]) == cli.EXIT_BAD_INPUT
    assert "unknown model" in capsys.readouterr().err


def test_a_model_failing_in_a_zoo_batch_spares_the_others(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys
) -> None:
    from polytile import batch
    from polytile.errors import ShapeError

    compile_one = batch._compile

    def failing(source: object, *args: object) -> object:
        if source == "transformer":
            raise ShapeError("input 'x' is dynamic")
        return compile_one(source, *args)

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(batch, "_compile", failing)
    out = tmp_path / "compiled"
    assert cli.main(["compile", "--zoo", "transformer,mlp", "-o", str(out)]) == cli.EXIT_BAD_INPUT
    captured = capsys.readouterr()
    assert "polytile: error: model 'transformer': input 'x' is dynamic" in captured.err
    assert "saved 1 of 2 models" in captured.out
    assert (out / "mlp.ptm" / "manifest.json").exists() and not (out / "transformer.ptm").exists()


def test_run_errors_name_the_input(tmp_path: Path, capsys) -> None:
    import numpy as np

    path = write_model(tmp_path / "relu.onnx")
    np.savez(tmp_path / "bad.npz", x=np.zeros((2, 4), np.float32))
    assert cli.main(["run", str(path), "-i", str(tmp_path / "bad.npz")]) == cli.EXIT_BAD_INPUT
    assert "input 'x' must have shape [2, 3]" in capsys.readouterr().err
    assert cli.main(["run", str(tmp_path / "missing.ptm")]) == cli.EXIT_BAD_INPUT


def test_tune_records_measurements_and_saves_the_cost_model(tmp_path: Path, capsys) -> None:
    from polytile.search.cost_model import RankModel, load_model
    from polytile.search.records import RecordFile

    path = write_model(tmp_path / "relu.onnx", shape=[64, 48])
    records, model = tmp_path / "r.jsonl", tmp_path / "model.pkl"
    argv = ["tune", str(path), "--trials", "4", "--records", str(records), "--batch", "2"]
    argv += ["--workers", "2", "--cost-model", str(model), "--cost-model-kind", "ranking"]
    argv += ["--no-flush-cache"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "estimated model latency" in out and "in-model validation" in out
    timings = [r.timing for r in RecordFile(records).read()]
    assert timings[:4] == ["kernel"] * 4 and set(timings[4:]) == {"model"}  # validated
    assert isinstance(load_model(model), RankModel)
    assert cli.main([*argv[:6], "--workers", "0"]) == cli.EXIT_BAD_INPUT
    assert "workers" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flag", "flushed", "top"),
    [
        ([], True, 8),
        (["--no-flush-cache"], False, 8),
        (["--validate", "5"], True, 5),
        (["--validate", "0"], True, 0),
        (["--cold", "all"], True, 8),
        (["--cold", "producer"], True, 8),
    ],
)
def test_tune_flushes_caches_and_validates_in_the_model_unless_told_not_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flag: list[str], flushed: bool, top: int
) -> None:
    """Whole-model tuning times kernels cold by default, their weights evicted (warm
    timings chose schedules that lost in the model, see the ResNet-50 results; `--cold
    producer` runs the kernels writing their inputs first, `--cold all` flushes the whole
    cache), then re-ranks the best candidates of each task inside the model."""
    import polytile.tuning as tune_module

    seen = {}

    def fake_tune(*args: object, measure: object, validation: object, **kwargs: object) -> object:
        seen.update(measure=measure, validation=validation, **kwargs)
        raise InputError("stop here")

    monkeypatch.setattr(tune_module, "tune", fake_tune)
    path = write_model(tmp_path / "relu.onnx")
    argv = ["tune", str(path), "--trials", "1", "--records", str(tmp_path / "r.jsonl"), *flag]
    assert cli.main(argv) == cli.EXIT_BAD_INPUT
    assert seen["measure"].flush_cache is flushed
    assert seen["measure"].cold == (flag[1] if "--cold" in flag else "weights")
    validation = seen["validation"]
    assert (validation.top if validation is not None else 0) == top
    assert seen["early_stopping"] is None


def test_tune_passes_early_stopping(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import polytile.tuning as tune_module

    seen = {}

    def fake_tune(*args: object, early_stopping: object, **kwargs: object) -> object:
        seen["early_stopping"] = early_stopping
        raise InputError("stop here")

    monkeypatch.setattr(tune_module, "tune", fake_tune)
    path = write_model(tmp_path / "relu.onnx")
    argv = ["tune", str(path), "--records", str(tmp_path / "r.jsonl"), "--early-stopping", "12"]
    assert cli.main(argv) == cli.EXIT_BAD_INPUT
    assert seen["early_stopping"] == 12


def test_tune_passes_the_build_workers_and_their_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import polytile.tuning as tune_module

    seen = {}

    def fake_tune(*args: object, measure: object, **kwargs: object) -> object:
        seen["measure"] = measure
        raise InputError("stop here")

    monkeypatch.setattr(tune_module, "tune", fake_tune)
    path = write_model(tmp_path / "relu.onnx")
    argv = ["tune", str(path), "--records", str(tmp_path / "r.jsonl")]
    argv += ["--build-workers", "3", "--build-timeout", "7.5"]
    assert cli.main(argv) == cli.EXIT_BAD_INPUT
    assert (seen["measure"].build_workers, seen["measure"].build_timeout) == (3, 7.5)
    assert cli.main([*argv[:4], "--build-workers", "0"]) == cli.EXIT_BAD_INPUT


def test_tune_rejects_a_negative_validation_count(tmp_path: Path, capsys) -> None:
    path = write_model(tmp_path / "relu.onnx")
    argv = ["tune", str(path), "--records", str(tmp_path / "r.jsonl"), "--validate", "-1"]
    assert cli.main(argv) == cli.EXIT_BAD_INPUT
    assert "--validate" in capsys.readouterr().err
    assert not (tmp_path / "r.jsonl").exists()


def matmul_model(path: Path) -> Path:
    w = onnx.numpy_helper.from_array(np.ones((64, 96), dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[w],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_explain_shows_the_schedule_compile_uses_here(tmp_path: Path, capsys) -> None:
    """This machine's vector width and threads (not a fixed 256-bit, 2-thread default),
    and with records the best record's trace instead of the default schedule."""
    path = matmul_model(tmp_path / "mm.onnx")
    target = host(3)
    config = default_config(target)
    assert cli.main(["explain", str(path), "--kernel", "0", "--threads", "3"]) == 0
    out = capsys.readouterr().out
    assert "default schedule" in out and f"{config.vector_width} float32 lanes, 3 threads" in out
    assert "tensors: t0 = x" in out
    kernel = extract_tasks(str(path))[0].kernel
    want = explain(default_schedule(kernel, config))
    assert want in out

    plain = initial_schedule(kernel)  # a record whose trace is empty: no vector, no tile
    record = Record(kernel.workload_key(), target.key(), tuple(plain.trace_json()), (1e-6,))
    records = tmp_path / "r.jsonl"
    RecordFile(records).append([record])
    argv = ["explain", str(path), "--kernel", "0", "--threads", "3", "--records", str(records)]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "tuning record's schedule" in out and explain(plain) in out and want not in out
