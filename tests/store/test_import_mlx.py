#!/usr/bin/env python3
"""
tests/store/test_import_mlx.py - `lmstore import` of an MLX quantized model
in the mlx-community layout (tests/fixtures/quant/mlx-llama, written by
mx.quantize and mx.save_safetensors: 4-bit groups of 32, layer 0's
down_proj 8-bit through a per-layer override): every packed weight becomes
MLX_AFFINE [out, in] with its bits and group size, bytes untouched, its
scales and biases stored beside it; inconsistent layouts and configs are
refused by name with the store unchanged.
"""
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(__file__))
import storeutil as su  # noqa: E402

FIX = os.path.join(su.SRC, "tests", "fixtures", "quant", "mlx-llama")


def info(store, name):
    _, out, _ = su.lms("info", name, "--json", "--store", store, check=0)
    return json.loads(out)


def test_mlx_model_imports_as_affine_tensors():
    base = su.scratch("mlx-import")
    store = os.path.join(base, "store")
    su.lms("import", FIX, "--name", "mlx", "--store", store, check=0)
    src = su.read_safetensors_raw(os.path.join(FIX, "model.safetensors"))
    by = {t["name"]: t for t in info(store, "mlx")["tensors"]}
    assert set(by) == set(src), set(by) ^ set(src)
    n_quant = 0
    for name, (dtype, shape, raw) in src.items():
        t = by[name]
        got = su.segment_bytes(store, t["segment"], t["offset"], t["nbytes"])
        assert got == raw, f"{name}: bytes changed"
        if name.endswith(".weight") and dtype == "U32":
            bits = 8 if name == "model.layers.0.mlp.down_proj.weight" else 4
            assert t["dtype"] == "MLX_AFFINE" and t["bits"] == bits and t["group_size"] == 32, t
            assert t["shape"] == [shape[0], shape[1] * 32 // bits], (t["shape"], shape)
            scales = src[name[:-len("weight")] + "scales"]
            assert scales[1] == [shape[0], t["shape"][1] // 32]
            n_quant += 1
        else:
            assert t["dtype"] == dtype and t["shape"] == shape and "bits" not in t, t
    assert n_quant == 15, n_quant  # 7 projections x 2 layers + the embedding


def mutated(base, tag, config=None, tensors=None):
    """A copy of the fixture with config.json changed by config(cfg) and the
    safetensors header changed by tensors(header)."""
    d = os.path.join(base, tag)
    shutil.copytree(FIX, d)
    if config:
        with open(os.path.join(d, "config.json")) as f:
            cfg = json.load(f)
        config(cfg)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f)
    if tensors:
        p = os.path.join(d, "model.safetensors")
        src = su.read_safetensors_raw(p)
        src = tensors(src)
        header, data, off = {"__metadata__": {"format": "mlx"}}, b"", 0
        for k, (dt, shape, raw) in src.items():
            header[k] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(raw)]}
            data += raw
            off += len(raw)
        su.write(p, su.st_bytes(header, data))
    return d


def test_inconsistent_mlx_models_are_refused_and_the_store_is_unchanged():
    base = su.scratch("mlx-rejects")
    store = os.path.join(base, "store")
    su.lms("import", FIX, "--name", "good", "--store", store, check=0)
    before = su.tree_digest(store)

    def drop(k):
        def f(s):
            del s[k]
            return s
        return f

    def regroup(s):  # scales claim a different group count
        dt, shape, raw = s["model.layers.1.self_attn.q_proj.scales"]
        s["model.layers.1.self_attn.q_proj.scales"] = (dt, [shape[0] * shape[1] // 1, 1], raw)
        return s

    def weight_f32(s):
        dt, shape, raw = s["model.layers.1.mlp.up_proj.weight"]
        s["model.layers.1.mlp.up_proj.weight"] = ("F32", shape, raw)
        return s

    cases = [
        ("no-quantization", dict(config=lambda c: (c.pop("quantization"), c.pop("quantization_config"))),
         "no \"quantization\""),
        ("mode-mxfp4", dict(config=lambda c: c["quantization"].update(mode="mxfp4")), "mode 'mxfp4'"),
        ("bits-7", dict(config=lambda c: c["quantization"].update(bits=7)), "7 bits"),
        ("group-48", dict(config=lambda c: c["quantization"].update(group_size=48)), "groups of 48"),
        ("override-wrong-bits", dict(config=lambda c: c["quantization"].update(
            {"model.layers.0.mlp.down_proj": {"group_size": 32, "bits": 4}})), "model.layers.0.mlp.down_proj"),
        ("override-false", dict(config=lambda c: c["quantization"].update(
            {"model.layers.1.mlp.gate_proj": False})), "not quantized"),
        ("missing-biases", dict(tensors=drop("model.layers.1.self_attn.k_proj.biases")), "k_proj.biases"),
        ("missing-weight", dict(tensors=drop("model.layers.1.self_attn.v_proj.weight")), "v_proj.weight"),
        ("scales-shape", dict(tensors=regroup), "q_proj"),
        ("weight-not-u32", dict(tensors=weight_f32), "U32"),
    ]
    bad = []
    for tag, kw, frag in cases:
        d = mutated(base, tag, **kw)
        rc, _, err = su.lms("import", d, "--name", tag, "--store", store)
        if rc != 1 or frag not in err or su.tree_digest(store) != before:
            bad.append(f"{tag}: exit {rc}: {err.strip()}")
        else:
            print(f"     {tag}: {err.strip()[:150]}")
    assert not bad, "\n".join(bad)


if __name__ == "__main__":
    su.run_tests(globals())
