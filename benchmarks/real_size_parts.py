"""What bench_real_size.py measures inside one process: peaks of host memory, the pipeline's phases,
a CPU twin of a neuron pipeline, and the inputs of one transformer step.

Beside bench_real_size.py (sys.path[0]); it imports torch, so only the child processes use it.
"""
import contextlib
import threading
import time

import torch

PROMPT = "a golden retriever surfing a wave, photorealistic"
SEED = 0
PHASES = ("text", "step", "vae")


class MemoryPeaks:
    """Peak anonymous and resident memory of this process. The kernel keeps only the resident peak
    (VmHWM), which counts the checkpoint's file pages a loader maps as well as memory the process
    owns, so a thread samples the anonymous part (RssAnon) every few ms."""

    def __init__(self, interval_s=0.005):
        self.interval_s, self.anon_peak, self._stop = interval_s, 0, threading.Event()
        self.reset()
        threading.Thread(target=self._sample, daemon=True).start()

    @staticmethod
    def status():
        values = {}
        with open("/proc/self/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("RssAnon", "RssFile", "VmHWM", "VmRSS"):
                    values[key] = int(rest.split()[0]) * 1024
        return values

    def _sample(self):
        while not self._stop.wait(self.interval_s):
            self.anon_peak = max(self.anon_peak, self.status()["RssAnon"])

    def reset(self):
        """Start new peaks from now (writing 5 to clear_refs resets VmHWM)."""
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        self.anon_peak = self.status()["RssAnon"]

    def peaks(self):
        now = self.status()
        return {"anon_peak": max(self.anon_peak, now["RssAnon"]), "resident_peak": now["VmHWM"],
                "anon_now": now["RssAnon"], "file_now": now["RssFile"]}


def module_bytes(module):
    """Bytes of a module's parameters and buffers, each storage once (tied weights share one)."""
    storages = {}
    for t in [*module.parameters(), *module.buffers()]:
        local = t.to_local() if hasattr(t, "to_local") else t
        storages[local.untyped_storage().data_ptr()] = local.untyped_storage().nbytes()
    return sum(storages.values())


def pipeline_bytes(pipe):
    return sum(module_bytes(getattr(pipe, name)) for name in ("text_encoder", "transformer", "vae"))


# ---------------------------------------------------------------- the CPU twin

def host_twin(module):
    """The same module class on CPU over the neuron module's bytes (CPU aliases, no copy): plain
    PyTorch's kernels on the very weights, at no extra memory."""
    from accelerate import init_empty_weights

    from torch_neuronx.runtime import ops

    from diffusers.configuration_utils import ConfigMixin

    with init_empty_weights(include_buffers=False):  # diffusers' models take their config as keywords
        twin = type(module).from_config(module.config) if isinstance(module, ConfigMixin) else type(module)(
            module.config)
    state = {name: ops._host_alias(t) for name, t in module.state_dict(keep_vars=True).items()}
    twin.load_state_dict(state, strict=True, assign=True)
    for name, buffer in module.named_buffers():  # non-persistent ones (rotary frequencies) too
        owner, _, leaf = name.rpartition(".")
        twin.get_submodule(owner)._buffers[leaf] = ops._host_alias(buffer)
    return twin.eval()


def host_twin_pipeline(pipe):
    import copy

    from diffusers import Flux2KleinPipeline

    return Flux2KleinPipeline(scheduler=copy.deepcopy(pipe.scheduler), tokenizer=pipe.tokenizer, is_distilled=True,
                              text_encoder=host_twin(pipe.text_encoder), transformer=host_twin(pipe.transformer),
                              vae=host_twin(pipe.vae))


_NARROWING = contextlib.ExitStack()  # never closed: the narrowing lasts as long as the process


def narrow_cpu_like_neuron():
    """Diffusers computes float64 as float32 on neuron (Trainium has none); CPU made to do the same, for
    the rest of this process, is the oracle the images are compared with."""
    from torch_neuronx.demo.pipelines import cpu_computing_as_neuron

    # Held here: a generator's context manager dropped after __enter__ is closed when collected, which
    # would undo the narrowing at once.
    _NARROWING.enter_context(cpu_computing_as_neuron())


# ---------------------------------------------------------------- phases

def _synchronize():
    if torch.neuron.is_available():
        torch.neuron.synchronize()


class PhaseTimes:
    """Seconds of each phase of a pipeline's calls: prompt encoding, each transformer call (a step),
    the VAE decode. The transformer is timed around its __call__ (a subclass of its own class), so
    a compiled transformer is timed without a graph break."""

    def __init__(self, pipe):
        self.samples = {phase: [] for phase in PHASES}
        pipe.encode_prompt = self._timed("text", pipe.encode_prompt)
        pipe.vae.decode = self._timed("vae", pipe.vae.decode)
        transformer, times = pipe.transformer, self

        class Timed(type(transformer)):
            def __call__(self, *args, **kwargs):
                return times._timed("step", super().__call__)(*args, **kwargs)

        Timed.__name__ = type(transformer).__name__
        transformer.__class__ = Timed

    def _timed(self, phase, fn):
        def timed(*args, **kwargs):
            _synchronize()
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            _synchronize()
            self.samples[phase].append(time.perf_counter() - start)
            return out
        return timed

    def take(self):
        """The phases of the calls since the last take: text and vae seconds, step seconds each."""
        taken = {phase: list(values) for phase, values in self.samples.items()}
        for values in self.samples.values():
            values.clear()
        return taken


def generate(pipe, size, steps):
    from torch_neuronx.demo.real_size import text_encoder_out_layers

    torch.manual_seed(SEED)
    layers = text_encoder_out_layers(pipe.text_encoder.config.num_hidden_layers)
    return pipe(prompt=PROMPT, height=size, width=size, num_inference_steps=steps, output_type="np",
                guidance_scale=1.0, text_encoder_out_layers=layers).images[0]


def load_pipeline(path, peaks):
    """from_pretrained in bf16, then to neuron: seconds and memory peaks of each."""
    from diffusers import Flux2KleinPipeline

    record = {}
    peaks.reset()
    start = time.perf_counter()
    pipe = Flux2KleinPipeline.from_pretrained(path, dtype=torch.bfloat16)
    pipe.set_progress_bar_config(disable=True)
    record["from_pretrained"] = {"s": time.perf_counter() - start, **peaks.peaks()}
    peaks.reset()
    start = time.perf_counter()
    pipe.to("neuron")
    record["to_neuron"] = {"s": time.perf_counter() - start, **peaks.peaks()}
    record["weights_bytes"] = pipeline_bytes(pipe)
    record["neuron_allocated_bytes"] = torch.neuron.memory_allocated()
    return pipe, record


# ---------------------------------------------------------------- one transformer step

def step_inputs(size, device, text_tokens=512):
    """What the pipeline passes the transformer at one step of a size x size image (latents of a
    size/16 grid of 128 channels, the prompt's 3 x 2560 features), drawn from one seed."""
    from diffusers import Flux2KleinPipeline

    generator = torch.Generator().manual_seed(SEED)
    grid = size // 16
    latents = torch.randn(1, 128, grid, grid, generator=generator, dtype=torch.bfloat16)
    prompt = torch.randn(1, text_tokens, 7680, generator=generator, dtype=torch.bfloat16)
    inputs = {"hidden_states": latents.flatten(2).transpose(1, 2), "encoder_hidden_states": prompt,
              "timestep": torch.tensor([0.75], dtype=torch.bfloat16), "guidance": None,
              "img_ids": Flux2KleinPipeline._prepare_latent_ids(latents),
              "txt_ids": Flux2KleinPipeline._prepare_text_ids(prompt), "return_dict": False}
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
