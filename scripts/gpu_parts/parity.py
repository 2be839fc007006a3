"""The parity part: the demo model exported, quantized and wrapped as generate.onnx, its step's node placement on
the device, and the held-out numbers on the device against the CPU."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .harness import CALIBRATION, DEMO, EXPORT, SCRIPT, Environment, Part, Report, Scale, say


@dataclass(frozen=True)
class Comparison:
    """One device-side translation of the numbers and the CPU reference it must equal (or meet the floor of)."""

    name: str
    model: str  # demo directory: fp32, fp16, int8, generate
    beam: int
    floor: str = "exact"  # or the precision whose verify floor (graphs.parity.MIN_AGREEMENT) it must meet
    graphs: bool = False

    @property
    def reference(self) -> str:
        return f"cpu {'generate' if self.model == 'generate' else 'fp32'} beam {self.beam}"


def comparisons(device: str, rehearse: bool) -> list[Comparison]:
    side = f"{device} device backend" if rehearse else device
    found = [Comparison(f"fp32 beam {beam}, {side}{', CUDA graphs' if graphs else ''}", "fp32", beam, graphs=graphs)
             for graphs in (False, True) for beam in (1, 4)]
    found += [Comparison(f"fp16 beam {beam}, {side}", "fp16", beam, "fp16") for beam in (1, 4)]
    found += [Comparison(f"int8 beam 1, {device}", "int8", 1, "int8")]
    return found + [Comparison(f"generate beam {beam}, {device}", "generate", beam) for beam in (1, 4)]


def parity_part(report: Report, env: Environment, work: Path, scale: Scale, inject: bool,
                only: Sequence[str] = ()) -> None:
    """The demo model's directories, where its step runs, and the held-out numbers on the device against the CPU;
    only: the checks whose names hold one of these (and the models and references they need)."""
    part = Part("parity", report, env, scale.budgets["parity"])
    chosen = lambda name: not only or any(o in name for o in only)  # noqa: E731
    checks = [c for c in comparisons(env.device, env.rehearse) if chosen(c.name)]
    placements = [name for name in ("fp32", "fp16", "int8") if chosen(f"placement {name}")]
    demo = {name: work / f"demo-{name}" for name in ("fp32", "fp16", "int8", "generate")}
    needed = {"fp32", *placements, *(c.model for c in checks)}
    make_demo(part, demo, [name for name in demo if name in needed], work, scale)
    # the device side is tfm-run's default on CUDA: the device backend where the directory has decoder_step_search
    # (fp32, fp16), the contract's decoder_step where not (int8 static); the rehearsal asks for the same on the CPU
    device = env.device
    rehearsal = {name: ["--backend", "onnxruntime-device"] if env.rehearse and name in ("fp32", "fp16") else []
                 for name in demo}
    for name in placements:
        part.step(f"placement {name}", [SCRIPT, "placement", "--model", demo[name], "--device", device,
                                        *rehearsal[name], "--label", f"{name} on {device}:"],
                  [demo[name] / "manifest.json"], timeout=120)
    numbers = {"loop": held_out(work, scale.numbers), "generate": held_out(work, min(scale.generate_numbers,
                                                                                      scale.numbers))}
    outputs = report.out / "parity"
    outputs.mkdir(exist_ok=True)
    file = lambda name: outputs / (name.replace(", ", "-").replace(" ", "-") + ".txt")  # noqa: E731

    def translate(name: str, model: str, beam: int, device: str, *options: str | Path) -> None:
        backend = ["--backend", "onnxruntime-generate"] if model == "generate" else []
        part.step(name, [SCRIPT, "translate", "--model", demo[model], "--device", device, "--beam", str(beam),
                         "--input", numbers["generate" if backend else "loop"], "--output", file(name),
                         "--label", name, *backend, *options],
                  [demo[model] / "manifest.json", *[o for o in options if isinstance(o, Path)]], timeout=180,
                  quiet=not options)

    for reference in dict.fromkeys(c.reference for c in checks):  # the CPU's own backends: in place, generate.onnx
        model, beam = reference.split()[1], int(reference.split()[-1])
        translate(reference, model, beam, "cpu")
    for n, check in enumerate(checks):
        options = [] if check.model == "generate" else [*rehearsal[check.model], *(["--cuda-graphs"] * check.graphs)]
        translate(check.name, check.model, check.beam, device, *options, "--against", file(check.reference),
                  "--reference", check.reference, "--floor", check.floor, *(["--perturb"] * (inject and n == 0)))
    part.done()


def held_out(work: Path, count: int) -> Path:
    """The first `count` held-out numbers, in a file of their own."""
    numbers = work / f"heldout-{count}.en.txt"
    lines = (DEMO / "heldout.en.txt").read_text(encoding="utf-8").splitlines()[:count]
    numbers.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return numbers


def make_demo(part: Part, demo: dict[str, Path], names: Sequence[str], work: Path, scale: Scale) -> None:
    """The demo model's directories that `names` asks for and --work lacks: fp32 exported, fp16 and int8 static
    (calibrated) quantized from it, generate.onnx written beside it."""
    calibration = CALIBRATION
    if scale.calibration:
        calibration = work / "calibration.txt"
        lines = CALIBRATION.read_text(encoding="utf-8").splitlines()[:scale.calibration]
        calibration.write_text("\n".join(lines) + "\n", encoding="utf-8")
    builds = {"fp32": ["onnx", "--checkpoint", DEMO / "ckpt.pt"],
              "fp16": ["quantize", "--model", demo["fp32"], "--precision", "fp16"],
              "int8": ["quantize", "--model", demo["fp32"], "--precision", "int8", "--calibration", calibration],
              "generate": ["generate", "--model", demo["fp32"]]}
    for name in names:
        if (demo[name] / "manifest.json").exists():
            say(f"kept {demo[name]} (made by an earlier run; --fresh makes it again)")
            continue
        needs = [demo["fp32"] / "manifest.json"] if name != "fp32" else []
        part.step(f"demo {name}", ["-c", EXPORT, *builds[name], "--output", demo[name], "--force"], needs,
                  timeout=240)
