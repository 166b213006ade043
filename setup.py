from setuptools import find_packages, setup

setup(
    name="tupe-plugin",
    version="0.1.0",
    description=(
        "fairseq --user-dir plugin: BERT-A/BERT-R/TUPE-A/TUPE-R and the position "
        "encodings of 'On Position Embeddings in BERT'"
    ),
    packages=find_packages(include=["tupe_plugin", "tupe_plugin.*"]),
    python_requires=">=3.9",
    install_requires=["torch>=2.1", "ve-fairseq==0.12.3", "sentencepiece"],
    extras_require={
        "test": ["pytest", "hypothesis"],
        "plots": ["matplotlib", "tensorboard"],
    },
)
