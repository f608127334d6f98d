"""llama.cpp's own file tools, run as a user runs them: the converter
(``convert_hf_to_gguf.py`` of the llama-cpp-python sdist's
``vendor/llama.cpp``) and the quantizer (``llama_cpp.llama_model_quantize``
of the installed llama-cpp-python). The tests' converter cases
(tests/llm/converter_cases.py, tests/llm/kquant_cases.py) and the
benchmark model files (bench/engine_models.py) are made with these.

One change to the converter, and why (the only one): it names the BPE
pre-tokenizer by hashing how the tokenizer splits a probe text and refuses
a tokenizer it does not know; a tokenizer trained in code (or rebuilt from
a GGUF by transformers) may split like a known one yet hash differently, so
``pre`` (when given) is the name the converter writes instead of hashing
(``"gpt-2"`` for GPT-2's split). Nothing else is touched.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

#: the llama-cpp-python release whose converter and quantizer make the files
SDIST_VERSION = "0.3.36"
SDIST_NAME = f"llama_cpp_python-{SDIST_VERSION}.tar.gz"

#: llama.cpp's ``llama_ftype`` of each quantisation a user names (llama.h)
FTYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10,
          "Q3_K_M": 12, "Q4_K_S": 14, "Q4_K_M": 15, "Q5_K_S": 16, "Q5_K_M": 17, "Q6_K": 18}

_CONVERT = """
import sys
vendor, pre = sys.argv[1], sys.argv[2]
sys.path.insert(0, vendor)
sys.argv = ["convert_hf_to_gguf.py"] + sys.argv[3:]
import convert_hf_to_gguf
if pre:
    from conversion import base
    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre  # see rcn_fast/testing/llamacpp_tools.py
convert_hf_to_gguf.main()
"""


def sdist(folder: Path, *, download: bool = True) -> Path:
    """The llama-cpp-python sdist: ``$RCN_FAST_LLAMACPP_SDIST``, else
    ``folder/llama_cpp_python-<version>.tar.gz``, fetched there with pip
    (``pip download --no-deps --no-binary :all:``) when ``download``.

    Raises
    ------
    FileNotFoundError
        Not there and ``download`` is False.
    """
    env = os.environ.get("RCN_FAST_LLAMACPP_SDIST")
    if env:
        return Path(env)
    path = Path(folder) / SDIST_NAME
    if not path.is_file():
        if not download:
            raise FileNotFoundError(f"{path}: the llama-cpp-python {SDIST_VERSION} sdist is not there "
                                    f"(set RCN_FAST_LLAMACPP_SDIST or pip download it)")
        Path(folder).mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        f"llama-cpp-python=={SDIST_VERSION}", "-d", str(folder)], check=True)
    return path


def sdist_digest(path: Path) -> str:
    """The sha256 (hex) of a file (the sdist, a built model file)."""
    from rcn_fast._hashing import sha256_file

    return sha256_file(path)


def vendor(sdist_path: Path, into: Path) -> Path:
    """``vendor/llama.cpp`` of the sdist, extracted under ``into`` (only the
    converter, its ``conversion`` package and gguf-py), once."""
    into = Path(into)
    root = f"llama_cpp_python-{SDIST_VERSION}/vendor/llama.cpp/"
    out = into / root
    if (out / "convert_hf_to_gguf.py").is_file():
        return out
    keep = (root + "convert_hf_to_gguf.py", root + "conversion/", root + "gguf-py/")
    with tarfile.open(sdist_path) as tf:
        members = [m for m in tf.getmembers() if m.name.startswith(keep)]
        tf.extractall(into, members=members, filter="data")
    return out


def convert(vendor_dir: Path, folder: Path, outfile: Path, outtype: str, *, pre: str | None = None) -> None:
    """``convert_hf_to_gguf.py folder --outtype outtype --outfile outfile``
    in a subprocess (``pre``: see the module's note)."""
    subprocess.run([sys.executable, "-c", _CONVERT, str(vendor_dir), pre or "", str(folder), "--outtype", outtype,
                    "--outfile", str(outfile)], check=True)


def quantize(src: Path, dst: Path, quant: str, *, threads: int = 2, token_embedding_type: int | None = None,
             output_tensor_type: int | None = None, pure: bool = False, allow_requantize: bool = False) -> None:
    """llama.cpp's quantizer (``llama_model_quantize``) on ``src`` into
    ``dst`` as ``quant`` (a key of :data:`FTYPES`); the type overrides are
    GGML type ids (llama-quantize's ``--token-embedding-type`` and
    ``--output-tensor-type``).

    Raises
    ------
    RuntimeError
        The quantizer failed (its return code).
    """
    import llama_cpp

    if quant not in FTYPES:
        raise ValueError(f"quant: expected one of {', '.join(FTYPES)}, got {quant!r}")
    params = llama_cpp.llama_model_quantize_default_params()
    params.nthread = threads
    params.ftype = FTYPES[quant]
    params.pure = pure
    params.allow_requantize = allow_requantize
    if token_embedding_type is not None:
        params.token_embedding_type = token_embedding_type
    if output_tensor_type is not None:
        params.output_tensor_type = output_tensor_type
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params)
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({src} -> {dst}, {quant}) returned {rc}")


def versions() -> dict[str, str]:
    """The installed llama-cpp-python and gguf versions (for a file's record)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for dist in ("llama-cpp-python", "gguf"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "not installed"
    return out


__all__ = ["SDIST_VERSION", "FTYPES", "sdist", "sdist_digest", "vendor", "convert", "quantize", "versions"]
