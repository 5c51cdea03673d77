#!/usr/bin/env python3
"""
tests/reference/make_llamacpp_fixtures.py - reference data from llama.cpp
(which we did not write) for lmstore's quantized models.

  python3 tests/reference/make_llamacpp_fixtures.py --llama-build DIR --llama-py DIR
          [--lmstore build/lmstore] [--model-dir models/smollm2-135m-instruct]
          [--out tests/fixtures/llamacpp] [--work DIR]

--llama-build: a cmake build of the llama.cpp that the PyPI sdist of
llama-cpp-python vendors (vendor/llama.cpp), with shared libraries
(-DBUILD_SHARED_LIBS=ON): its bin/ holds llama-quantize and libllama.so.
--llama-py: the unpacked sdist, whose llama_cpp/ package (ctypes bindings)
is used over that libllama (LLAMA_CPP_LIB_PATH). bench/bench_vs_llamacpp.sh
builds both (see its header). Needs numpy and gguf (PyPI).

What it writes (small JSON files, committed):

1. OUT/quantize.json: for two tiny random models made by tests/gen_model.py
   (a tied Llama whose rows of 320 are not whole K blocks, and a Qwen3 with
   rows of 256), the SHA-256 of every tensor of the GGUF files
   llama-quantize makes (Q8_0, Q4_0, Q4_K_M) from the BF16 GGUF that
   `lmstore export` writes. tests/tools/test_llamacpp_quantize.py checks
   that `lmstore quantize` (q8_0, q4_0, q4_k_m) + export gives those bytes.

2. OUT/smollm2.json: the README's default model (MODEL_DIR, as
   tools/quickstart.sh converts it) quantized by llama-quantize to Q8_0 and
   Q4_K_M, and for each file:
   - the SHA-256 of every tensor (so the test can prove it runs the same
     bytes: lmstore quantize --type q8_0 / q4_k_m equals llama-quantize);
   - for candidate prompts (ids from llama.cpp's tokenizer), llama.cpp's
     greedy continuation of 32 tokens (prompt in one batch, then one token at
     a time, as llama-cli runs) and the top-1 minus top-2 logit margin at
     each step, and whether llama.cpp gives the same continuation when the
     prompt is fed one token at a time;
   - "greedy_prompts": the three candidates whose continuation llama.cpp
     itself reproduces both ways with the largest smallest margin over both
     files (chosen from llama.cpp's numbers only). 8-bit activations make
     logits differ by a few percent between any two summation orders --
     llama.cpp's batch and single-token paths differ from each other that
     much ("self_noise" records it) -- so a step whose margin is smaller
     than that noise can go either way in any engine, llama.cpp included;
   - perplexity of PPL_TEXT's tokens (exp of the mean negative
     log-likelihood of tokens 2..N, one window, float64 over llama.cpp's
     float32 logits), with the text in batches of 512 and, to show what
     the summation order alone moves, a token at a time.
"""

import argparse
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import gguf

N_GEN = 32
CHAT = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n")
CANDIDATES = [
    CHAT % "What is the capital of France?",
    CHAT % "Count from 1 to 20.",
    CHAT % "What is 2 + 2?",
    CHAT % "List the planets of the solar system.",
    "1, 2, 3, 4, 5, 6, 7, 8,",
    "10, 20, 30, 40, 50,",
    "2, 4, 6, 8, 10, 12,",
    "Monday, Tuesday, Wednesday,",
    "January, February, March, April,",
    "def fibonacci(n):\n",
    "for i in range(10):\n    print(i)\nfor i in range(10):\n",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "Python is a programming language that",
    "The United States of America",
]
PPL_TEXT = (
    "The Moon is Earth's only natural satellite. It orbits at an average distance of 384,400 km, about 30 "
    "times the diameter of Earth. The Moon always presents the same side to Earth, because gravitational pull "
    "has locked its rotation to the planet. This means the lunar day is the same length as the lunar month.\n\n"
    "Water boils at 100 degrees Celsius at sea level. At higher altitudes the air pressure is lower, so water "
    "boils at a lower temperature, and food takes longer to cook. A pressure cooker raises the pressure inside "
    "the pot, which raises the boiling point and shortens cooking times.\n\n"
    "A computer program is a sequence of instructions that a computer can execute. Programs are usually "
    "written in a programming language such as Python, C or Java, and then translated into machine code by a "
    "compiler or run by an interpreter. Good programs are easy to read, easy to test and easy to change.\n\n"
    "Bread is made from flour, water, salt and yeast. The yeast feeds on the sugars in the flour and releases "
    "carbon dioxide, which makes the dough rise. Baking sets the structure of the loaf and browns its crust. "
    "Many cultures have their own breads, from flat breads cooked on hot stones to tall loaves baked in ovens.\n\n"
    "The heart is a muscle that pumps blood through the body. Blood carries oxygen from the lungs to the "
    "organs and brings carbon dioxide back to be breathed out. A resting adult heart beats about sixty to one "
    "hundred times a minute, and regular exercise makes it stronger.\n\n"
    "Rivers begin as small streams in hills and mountains, fed by rain and melting snow. As they flow downhill "
    "they join together, grow wider and carry sand and mud towards the sea. Where a river meets the sea it often "
    "drops this material and builds a delta, a flat area of rich soil that farmers have used for thousands of "
    "years.\n\n"
    "A library lends books, music and films to the people of a town. Libraries also offer quiet rooms for "
    "study, computers with internet access and help from librarians, who know how to find information. Many "
    "libraries run reading groups for children and classes for adults who want to learn new skills.\n\n"
    "Bees collect nectar and pollen from flowers. While they move from one flower to the next they carry pollen "
    "with them, which helps the plants make seeds and fruit. A single hive can hold tens of thousands of bees, "
    "and they turn the nectar into honey to feed the colony through the winter.\n\n"
    "Trains move people and goods over long distances using less fuel than cars or trucks. Modern high-speed "
    "trains run on special tracks and can travel at more than three hundred kilometres an hour. In many "
    "countries the railway network connects the largest cities, and commuter trains bring workers from the "
    "suburbs into the centre every morning.\n\n"
    "The weather changes from day to day, while the climate describes the usual weather of a place over many "
    "years. Scientists measure temperature, rainfall, wind and air pressure at thousands of stations around the "
    "world. Computers use these measurements to forecast the weather for the next few days.\n\n"
    "Learning a new language takes time and practice. It helps to listen to native speakers, to read simple "
    "books and to speak as often as possible, even when mistakes happen. Small daily steps, such as learning "
    "ten new words, add up to real progress over a few months.\n\n"
    "Mathematics studies numbers, shapes and patterns. Addition and multiplication are among the first "
    "operations children learn, and later they meet fractions, equations and geometry. Engineers, doctors and "
    "economists all use mathematics in their daily work, often with the help of computers.\n\n"
    "Forests cover almost a third of the land on Earth. Trees take in carbon dioxide and release oxygen, and "
    "their roots hold the soil in place. Forests are home to many animals and plants, and they give people "
    "wood, food and medicine. Protecting them is one of the most important tasks of our time.\n"
)

TINY = [
    # name, gen_model.py arguments
    ("llama-tied-320", ["--arch", "llama", "--hidden", "320", "--intermediate", "512", "--layers", "8",
                        "--heads", "4", "--kv-heads", "2", "--vocab", "384", "--tied", "--seed", "7",
                        "--std", "0.05", "--single-file"]),
    ("qwen3-256", ["--arch", "qwen3", "--hidden", "256", "--intermediate", "768", "--layers", "8",
                   "--heads", "4", "--kv-heads", "2", "--head-dim", "64", "--vocab", "512", "--seed", "8",
                   "--std", "0.05", "--single-file"]),
]


def dump(obj, path):
    """JSON with one line per list of numbers (ids, margins)."""
    import re
    txt = json.dumps(obj, indent=1)
    txt = re.sub(r"\[\s*([-0-9.e,\s]+?)\s*\]", lambda m: "[" + ", ".join(m.group(1).split()).replace(",,", ",") + "]", txt)
    with open(path, "w") as f:
        f.write(txt + "\n")


def run(*cmd, **kw):
    return subprocess.run(list(cmd), check=True, capture_output=True, text=True, **kw)


def tensor_digests(path):
    r = gguf.GGUFReader(path)
    return {t.name: {"type": t.tensor_type.name,
                     "sha256": hashlib.sha256(np.ascontiguousarray(t.data).tobytes()).hexdigest()}
            for t in r.tensors}


def quantize_all(a, store, model, work, types):
    """lmstore export MODEL -> BF16 GGUF -> llama-quantize TYPE; {type: path}."""
    src = os.path.join(work, f"{model}-bf16.gguf")
    if os.path.exists(src):
        os.remove(src)
    run(a.lmstore, "export", model, src, "--store", store)
    out = {}
    for t in types:
        dst = os.path.join(work, f"{model}-{t}.gguf")
        run(os.path.join(a.llama_build, "bin", "llama-quantize"), src, dst, t)
        out[t] = dst
    return out


def tiny_models(a, work):
    store = os.path.join(work, "store-tiny")
    shutil.rmtree(store, ignore_errors=True)
    res = []
    gen = os.path.join(a.src, "tests", "gen_model.py")
    for name, args in TINY:
        d = os.path.join(work, name)
        run(sys.executable, gen, d, *args, "--force")
        run(a.lmstore, "import", d, "--name", name, "--store", store)
        files = quantize_all(a, store, name, work, ["Q8_0", "Q4_0", "Q4_K_M"])
        res.append({"name": name, "gen_model_args": args,
                    "files": {t: tensor_digests(p) for t, p in files.items()}})
        print(f"{name}: " + ", ".join(f"{t} {len(v)} tensors" for t, v in res[-1]["files"].items()))
    return {"llama_cpp": a.version, "models": res}


def greedy(m, toks, one_by_one):
    m.reset()
    if one_by_one:
        for t in toks:
            m.eval([t])
    else:
        m.eval(toks)
    ids, margins = [], []
    for _ in range(N_GEN):
        lg = np.array(m.scores[m.n_tokens - 1], dtype=np.float64)
        o = np.sort(lg)[::-1]
        t = int(np.argmax(lg))
        ids.append(t)
        margins.append(round(float(o[0] - o[1]), 4))
        m.eval([t])
    return ids, margins


def self_noise(m, toks):
    """Median over positions of max|batch - single| / max|batch| of llama.cpp's own logits."""
    m.reset()
    m.eval(toks)
    a = np.array(m.scores[:len(toks)])
    m.reset()
    for t in toks:
        m.eval([t])
    b = np.array(m.scores[:len(toks)])
    return float(np.median([np.max(np.abs(a[k] - b[k])) / np.max(np.abs(a[k])) for k in range(len(toks))]))


def perplexity(m, ids, one_by_one=False):
    m.reset()
    if one_by_one:
        for t in ids:
            m.eval([t])
    else:
        m.eval(ids)
    lg = np.array(m.scores[:len(ids)], dtype=np.float64)
    nll = 0.0
    for i in range(1, len(ids)):
        row = lg[i - 1]
        mx = row.max()
        nll += mx + math.log(np.exp(row - mx).sum()) - row[ids[i]]
    return math.exp(nll / (len(ids) - 1))


def smollm2(a, work):
    from llama_cpp import Llama
    store = os.path.join(work, "store-smollm2")
    shutil.rmtree(store, ignore_errors=True)
    run(a.lmstore, "import", a.model_dir, "--name", "smollm2", "--store", store)
    files = quantize_all(a, store, "smollm2", work, ["Q8_0", "Q4_K_M"])
    out = {"llama_cpp": a.version, "ppl_text": PPL_TEXT, "files": {}}
    for t, path in files.items():
        m = Llama(path, n_ctx=2048, n_batch=512, n_threads=2, logits_all=True, verbose=False)
        cands = []
        for p in CANDIDATES:
            toks = m.tokenize(p.encode(), add_bos=False, special=True)
            ids, margins = greedy(m, toks, False)
            ids2, _ = greedy(m, toks, True)
            cands.append({"prompt": p, "prompt_ids": toks, "ids": ids, "margins": margins,
                          "same_one_by_one": ids == ids2})
        ppl_ids = m.tokenize(PPL_TEXT.encode(), add_bos=False, special=False)
        out["ppl_ids"] = ppl_ids
        out["files"][t] = {
            "tensors": tensor_digests(path),
            "candidates": cands,
            "self_noise": self_noise(m, ppl_ids[:64]),
            "ppl": perplexity(m, ppl_ids),
            "ppl_one_by_one": perplexity(m, ppl_ids, True),
        }
        print(f"SmolLM2 {t}: ppl {out['files'][t]['ppl']:.4f} over {len(ppl_ids)} tokens "
              f"({out['files'][t]['ppl_one_by_one']:.4f} a token at a time), "
              f"llama.cpp batch vs one-by-one logits differ by {out['files'][t]['self_noise']:.4f} (median)")
        del m
    # the three candidates llama.cpp reproduces both ways with the largest smallest margin
    score = []
    for i, p in enumerate(CANDIDATES):
        fs = [out["files"][t]["candidates"][i] for t in files]
        if all(f["same_one_by_one"] for f in fs):
            score.append((min(min(f["margins"]) for f in fs), i))
    score.sort(reverse=True)
    out["greedy_prompts"] = [i for _, i in score[:3]]
    for s, i in score[:3]:
        print(f"greedy prompt {i}: smallest margin {s:.3f}: {CANDIDATES[i]!r}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    ap.add_argument("--llama-build", required=True)
    ap.add_argument("--llama-py", required=True)
    ap.add_argument("--lmstore", default=os.path.join(src, "build", "lmstore"))
    ap.add_argument("--model-dir", default=os.path.join(src, "models", "smollm2-135m-instruct"))
    ap.add_argument("--out", default=os.path.join(src, "tests", "fixtures", "llamacpp"))
    ap.add_argument("--work", default="/tmp/lms-llamacpp-fixtures")
    ap.add_argument("--skip-smollm2", action="store_true")
    a = ap.parse_args()
    a.src = src
    a.lmstore = os.path.abspath(a.lmstore)
    a.llama_build = os.path.abspath(a.llama_build)
    os.environ["LLAMA_CPP_LIB_PATH"] = os.path.join(a.llama_build, "bin")
    sys.path.insert(0, os.path.abspath(a.llama_py))
    import llama_cpp
    a.version = f"llama-cpp-python {llama_cpp.__version__} (vendored llama.cpp, CPU build)"
    os.makedirs(a.out, exist_ok=True)
    os.makedirs(a.work, exist_ok=True)
    dump(tiny_models(a, a.work), os.path.join(a.out, "quantize.json"))
    if not a.skip_smollm2:
        dump(smollm2(a, a.work), os.path.join(a.out, "smollm2.json"))


if __name__ == "__main__":
    main()
