from setuptools import find_packages, setup

# The user-facing commands: name -> the module whose main(argv) runs it.
COMMANDS = {
    "tupe-study": "tupe_plugin.study.cli",
    "tupe-analyze": "tupe_plugin.analysis.cli",
    "tupe-export-embeddings": "tupe_plugin.analysis.export_embeddings",
    "tupe-prepare-glue": "tupe_plugin.glue.prepare",
    "tupe-finetune-glue": "tupe_plugin.glue.finetune",
    "tupe-collect-glue": "tupe_plugin.glue.scores",
    "tupe-prepare-squad": "tupe_plugin.squad.prepare",
    "tupe-finetune-squad": "tupe_plugin.squad.finetune",
    "tupe-evaluate-squad": "tupe_plugin.squad.evaluate",
    "tupe-convert-official": "tupe_plugin.conversion.cli",
    "tupe-convert-hf": "tupe_plugin.conversion.hf_cli",
    "tupe-export-hf": "tupe_plugin.conversion.hf_export",
    "tupe-build-corpus": "tupe_plugin.corpus.build",
    "tupe-train-spm": "tupe_plugin.corpus.train_spm",
    "tupe-show-progress": "tupe_plugin.cli.progress",
    "tupe-encodings": "tupe_plugin.models.encoding_listing",
}

setup(
    name="tupe-plugin",
    version="0.1.0",
    description=(
        "fairseq --user-dir plugin: BERT-A/BERT-R/TUPE-A/TUPE-R and the position "
        "encodings of 'On Position Embeddings in BERT'"
    ),
    packages=find_packages(include=["tupe_plugin", "tupe_plugin.*"]),
    # hf_remote/ is the code tupe-export-hf copies into every export, not a package of the plugin
    package_data={"tupe_plugin.attention": ["*.cpp"], "tupe_plugin.conversion": ["hf_remote/*.py"]},
    python_requires=">=3.11",
    # torch >= 2.6: torch.load's weights_only default, which the plugin's checkpoint loading is built
    # around; < 2.14: the versions tested (2.13.0).
    install_requires=[
        "torch>=2.6,<2.14",
        "ve-fairseq==0.12.3",
        "numpy",
        "omegaconf",
        "sentencepiece",
        # builds the compiled CPU attention backward on first use (tupe_plugin/attention/compiled_kernels.py)
        "ninja",
    ],
    extras_require={
        # tupe-analyze draws its figures with matplotlib
        "analysis": ["matplotlib"],
        # tupe-study: the analysis and report figures, fairseq-train's tensorboard logs, the submitit launcher
        "study": ["matplotlib", "tensorboard", "submitit"],
        # tupe-export-hf builds the export's tokenizer.json with Hugging Face tokenizers
        "export": ["tokenizers"],
        # the tests of tupe-convert-hf compare with transformers' BERT and RoBERTa; transformers is also
        # what fairseq's --bpe bert imports to encode text for a converted BERT; the Triton attention
        # kernel's tests run its kernels through Triton's CPU interpreter; the tests of tupe-export-hf
        # fine-tune an export with transformers' Trainer, which needs accelerate; make test runs them on every
        # core with pytest-xdist
        "test": ["pytest", "pytest-xdist", "hypothesis", "transformers>=5,<6", "accelerate", "triton",
                 "tokenizers"],
    },
    entry_points={
        "console_scripts": [f"{name} = {module}:main" for name, module in COMMANDS.items()],
    },
)
