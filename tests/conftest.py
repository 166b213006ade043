import argparse
import os
import shutil
import sys

import pytest
import torch

# Where torch sees no GPU, Triton kernels run through Triton's interpreter. The variable must be set before
# Triton is first imported by anything (torch.compile in a FlexAttention test imports it too): Triton
# decorates its own library functions (tl.rand, ...) for the interpreter or for a GPU when it is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Under pytest-xdist (make test) the workers share the machine's cores: torch's threads in each worker, and in
# the commands its tests start, are the worker's share of them.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    _THREADS = max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    os.environ["OMP_NUM_THREADS"] = str(_THREADS)
    torch.set_num_threads(_THREADS)

from fairseq.data import Dictionary  # noqa: E402
from fairseq.models import ARCH_CONFIG_REGISTRY

import tupe_plugin  # noqa: F401  (registers the model and archs)
from tupe_plugin.fairseq_fixes import known_warnings
from tupe_plugin.models import TupeRobertaModel
from tupe_plugin.encodings import registry
from tupe_plugin.encodings.position_config import DEFAULTS, PositionConfig
from tupe_plugin.models.architectures import POSITION_PRESETS
from tupe_plugin.terms.parts import DenseBias, OffsetRows

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEST_DATA = os.path.join(REPO, "tests", "data")
VENV_BIN = os.path.dirname(sys.executable)
PRESETS = sorted(POSITION_PRESETS)


def preset_encodings(preset):
    """The registered encodings (:data:`~tupe_plugin.encodings.registry.ENCODINGS`) the position preset
    ``preset`` of :data:`~tupe_plugin.models.architectures.POSITION_PRESETS` selects."""
    flags = {**DEFAULTS, **dict.fromkeys(registry.FAMILIES, "none"), **POSITION_PRESETS[preset]}
    return tuple(registry.used(argparse.Namespace(**flags)))


def preset_config(preset, size="tiny", max_positions=32):
    """The :class:`~tupe_plugin.encodings.position_config.PositionConfig` of the architecture
    ``{preset}_{size}`` built for ``max_positions``."""
    args = argparse.Namespace(max_positions=max_positions)
    ARCH_CONFIG_REGISTRY[f"{preset}_{size}"](args)
    flags = {flag: getattr(args, flag) for flag in DEFAULTS}
    return PositionConfig(embed_dim=args.encoder_embed_dim, num_heads=args.encoder_attention_heads,
                          max_positions=args.max_positions, **flags)


def runs_on(path, preset):
    """Whether the attention ``path`` reads every part of the preset's term as the attention plan hands it
    over (:data:`~tupe_plugin.attention.paths.PATH_READS`)."""
    from tupe_plugin.models.encoding_listing import reads_all

    config = preset_config(preset)
    return all(reads_all(path, encoding, config) for encoding in config.encodings())


def native_type(preset):
    """The ``model_type`` of transformers' own class that ``tupe-export-hf`` writes the preset's tiny model
    as, by its encodings' ``hf_native`` (the first type every encoding names; RoBERTa without any), or
    None: the remote-code export."""
    from tupe_plugin.conversion import hf_native

    config = preset_config(preset)
    every = [encoding.native_types(config)[0] for encoding in config.encodings()]
    common = [model_type for model_type in (every[0] if every else (hf_native.NO_POSITION_TYPE,))
              if all(model_type in types for types in every)]
    return common[0] if common else None


def choices_of_kind(*kinds):
    """(family, value) of every flag value that selects a registered encoding of one of ``kinds``."""
    return [(encoding.family, choice) for encoding in registry.ENCODINGS if encoding.kind in kinds
            for choice in encoding.choices]


def load_benchmark(name):
    """The module of ``benchmarks/NAME.py``, loaded from its file (benchmarks/ is a folder of scripts, which
    find the repository's packages themselves)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, "benchmarks", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_data(*parts):
    """Path of a file or folder under tests/data, the excerpts of real data (tests/data/SOURCES.md)."""
    return os.path.join(TEST_DATA, *parts)


test_data.__test__ = False  # a helper, not a test, in the modules that import it


class _Task:
    def __init__(self, dictionary, max_positions):
        self.source_dictionary = dictionary
        self._max_positions = max_positions

    def max_positions(self):
        return self._max_positions


def make_dictionary(size=40):
    dictionary = Dictionary()
    for i in range(size):
        dictionary.add_symbol(f"w{i}")
    dictionary.add_symbol("<mask>")
    return dictionary


def build_model(arch, dictionary=None, max_positions=32, **overrides):
    """Build a plugin model the way fairseq-train does: preset, then build_model; dropout off."""
    overrides.setdefault("dropout", 0.0)
    overrides.setdefault("attention_dropout", 0.0)
    args = argparse.Namespace(arch=arch, max_positions=max_positions, **overrides)
    ARCH_CONFIG_REGISTRY[arch](args)
    dictionary = dictionary or make_dictionary()
    return TupeRobertaModel.build_model(args, _Task(dictionary, max_positions))


def random_tokens(dictionary, lengths, seed=0):
    """Right-padded batch starting with <s>, one row per length."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.full((len(lengths), max(lengths)), dictionary.pad())
    for row, length in enumerate(lengths):
        tokens[row, 0] = dictionary.bos()
        tokens[row, 1:length] = torch.randint(
            dictionary.nspecial, len(dictionary), (length - 1,), generator=generator
        )
    return tokens


def features_and_grads(model, tokens, weights, features_fn=None, seed=None):
    """Features of ``tokens`` and every parameter's gradient of sum(features * weights).

    ``features_fn`` defaults to the model's forward; ``seed`` reseeds torch first (dropout masks).
    """
    if seed is not None:
        torch.manual_seed(seed)
    model.zero_grad()
    features = (features_fn or (lambda t: model(t, features_only=True)[0]))(tokens)
    (features * weights).sum().backward()
    return features.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                               if p.grad is not None}


def assert_kernel_took_the_terms_rows(model, seq_len, calls):
    """Each of ``calls`` ((dense bias, rows, cls) a kernel was handed, one a layer) holds the forward's term
    as the distance bias's O(T) form: its Toeplitz rows and [CLS] values as the term holds them, and as the
    dense bias TUPE's untied product alone (or none)."""
    assert len(calls) == model.args.encoder_layers
    with torch.no_grad():
        term = model.encoder.sentence_encoder.positional_term.content_free(seq_len)
        untied = term.folded().get(DenseBias)
        untied = None if untied is None else untied.bias
    for bias, rows, cls in calls:
        if untied is None:
            assert bias is None
        else:
            torch.testing.assert_close(bias, untied[None])
        torch.testing.assert_close(rows, term.get(OffsetRows).rows)
        assert (cls is None) == (term.get(OffsetRows).cls is None)
        if cls is not None:
            torch.testing.assert_close(cls, term.get(OffsetRows).cls)


def assert_gradients_close(actual, expected, atol=1e-5, rtol=1e-4, rename=lambda name: name):
    """Each parameter's gradient in ``actual`` equals ``expected`` up to float32 rounding.

    The absolute tolerance is ``atol`` or 1e-6 of the tensor's largest entry, whichever is larger:
    the embedding LayerNorm over a 0.02-std table (and dropout's 1/(1-p)) makes some gradients a few
    hundred, whose last bits differ between CPUs and kernels (measured: 6e-5 at 209, Xeon, AVX-512).
    """
    assert {rename(name) for name in expected} == set(actual)
    for name, grad in expected.items():
        tolerance = max(atol, 1e-6 * grad.abs().max().item())
        torch.testing.assert_close(actual[rename(name)], grad, atol=tolerance, rtol=rtol,
                                   msg=lambda message, name=name: f"gradient of {name}: {message}")


def assert_equals_the_twin(model, dictionary, lengths=(9, 6, 4)):
    """Features and every gradient of a padded batch of ``lengths`` equal the paper twin's
    (:func:`paper_equations.encoder_features`; fp32, 1e-5)."""
    from paper_equations import encoder_features

    tokens = random_tokens(dictionary, list(lengths))
    keep = tokens.ne(dictionary.pad()).unsqueeze(-1)
    weights = torch.randn(*tokens.shape, model.args.encoder_embed_dim) * keep
    encoder = model.encoder.sentence_encoder
    fused, fused_grads = features_and_grads(model, tokens, weights)
    plain, plain_grads = features_and_grads(model, tokens, weights, lambda t: encoder_features(encoder, t))
    torch.testing.assert_close(fused * keep, plain * keep, atol=1e-5, rtol=1e-5)
    assert_gradients_close(fused_grads, plain_grads)


@pytest.fixture
def dictionary():
    return make_dictionary()


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """fairseq's and torch's known-harmless warnings filtered as in a run: pytest resets the filters for
    every test, and a module- or session-scoped fixture the test is the first to need runs before any
    function-scoped one."""
    known_warnings.install()


def built_once(tmp_path_factory, name, build):
    """The folder ``build(folder)`` fills, built once per test run: under pytest-xdist the workers share one
    folder, the first to ask builds it under a file lock while the others wait, and a build that failed is
    started again by the next worker to ask (its partial folder removed first)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        folder = tmp_path_factory.mktemp(name)
        build(folder)
        return folder
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp().parent  # this run's folder, above each worker's own
    folder, done = shared / name, shared / f"{name}.done"
    with FileLock(str(shared / f"{name}.lock")):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            build(folder)
            done.touch()
    return folder


@pytest.fixture(scope="session")
def wikitext_bin(tmp_path_factory):
    """The first lines of WikiText-2 valid (train) and the next ones (valid), binarized."""
    def build(root):
        with open(test_data("wikitext-2", "wiki.valid.head.tokens"), encoding="utf-8") as f:
            lines = f.readlines()
        (root / "train.txt").write_text("".join(lines[:300]), encoding="utf-8")
        (root / "valid.txt").write_text("".join(lines[300:400]), encoding="utf-8")
        from cli import run_fairseq

        run_fairseq(
            "preprocess", "--only-source", "--trainpref", root / "train.txt",
            "--validpref", root / "valid.txt", "--destdir", root / "bin", "--workers", 1,
        )

    return built_once(tmp_path_factory, "wikitext", build) / "bin"


@pytest.fixture(scope="session")
def pretrained_dir(tmp_path_factory):
    """A tiny TUPE-R trained for 2 updates on WikiText-2 paragraphs with a sentencepiece vocabulary."""
    def build(root):
        import sentencepiece as spm
        from cli import run_fairseq, train_args

        with open(test_data("wikitext-2", "wiki.valid.head.tokens"), encoding="utf-8") as f:
            sentences = [line.strip() for line in f if line.strip()]
        (root / "raw.txt").write_text("\n".join(sentences) + "\n", encoding="utf-8")
        spm.SentencePieceTrainer.train(
            input=str(root / "raw.txt"), model_prefix=str(root / "spm"), vocab_size=300,
            model_type="unigram", minloglevel=2,
        )
        processor = spm.SentencePieceProcessor(model_file=str(root / "spm.model"))
        encoded = [" ".join(processor.encode(s, out_type=str)) for s in sentences]
        (root / "train.bpe").write_text("\n".join(encoded[:-20]) + "\n", encoding="utf-8")
        (root / "valid.bpe").write_text("\n".join(encoded[-20:]) + "\n", encoding="utf-8")
        data = root / "data-bin"
        run_fairseq("preprocess", "--only-source", "--trainpref", root / "train.bpe",
                    "--validpref", root / "valid.bpe", "--destdir", data, "--workers", 1)
        shutil.copy(root / "spm.model", data / "sentencepiece.bpe.model")
        run_fairseq("train", *train_args(data, root / "checkpoints", "tupe_r_tiny", 2))

    return built_once(tmp_path_factory, "hub", build)


# The length every preset's tiny model without a learned table of positions (PositionConfig.learned_tables) is
# validated at after training at 64 tokens: the length-generalisation check.
LONG_VALIDATION = 256


def without_learned_tables(preset):
    """Whether the preset's tiny model keeps no learned table of positions (an absolute or untied table,
    DeBERTa's Enhanced Mask Decoder's), and so may validate beyond its training length."""
    return not preset_config(preset).learned_tables


@pytest.fixture(scope="session")
def every_preset_run(wikitext_bin, tmp_path_factory):
    """Every preset's tiny model through fairseq's commands, in chains run side by side (fairseq's import paid
    once a chain): fairseq-train (2 updates, 64 tokens), fairseq-validate, and, for a model without a learned
    table of positions, fairseq-validate at :data:`LONG_VALIDATION` tokens. ({preset: the outputs of its
    commands}, {preset: the end of its chain's output}); a preset whose command failed ends its chain, and it
    and the presets after it in that chain have no entry."""
    import json

    from cli import run_fairseq_for_each, train_args, validate_args

    def steps(root, preset):
        checkpoint = root / preset / "checkpoint_last.pt"
        longer = ["--tokens-per-sample", LONG_VALIDATION,
                  "--model-overrides", f"{{'max_positions': {LONG_VALIDATION}}}"]
        steps = [("train", train_args(wikitext_bin, root / preset, f"{preset}_tiny", 2)),
                 ("validate", validate_args(wikitext_bin, checkpoint))]
        if without_learned_tables(preset):
            steps.append(("validate", validate_args(wikitext_bin, checkpoint, *longer)))
        return steps

    def build(root):
        outputs = run_fairseq_for_each(PRESETS, lambda preset: steps(root, preset))
        (root / "outputs.json").write_text(json.dumps(outputs))

    folder = built_once(tmp_path_factory, "every_preset", build)
    return tuple(json.loads((folder / "outputs.json").read_text()))


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` are deselected (not skipped) where torch sees no CUDA device."""
    if torch.cuda.is_available():
        return
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if gpu:
        config.hook.pytest_deselected(items=gpu)
        items[:] = [item for item in items if not item.get_closest_marker("gpu")]
