"""The GLUE tasks: each one's files and columns, its classes, its metric and its fine-tuning epochs.

The one table of them. tupe-prepare-glue reads the files and columns, tupe-finetune-glue the classes,
metric and epochs, the study the files and the metrics. Metrics are named as fairseq's
``sentence_prediction`` task logs them; each is maximised.
The metrics and epochs are those of TUPE (Ke et al., arXiv 2006.15595) Table 1 and 2: Matthews
correlation for CoLA, F1 (and accuracy) for MRPC and QQP, Pearson and Spearman correlations for STS-B,
accuracy elsewhere;
10 epochs, 5 for the large MNLI, QNLI and QQP.

``python -m tupe_plugin.glue.tasks`` lists the tasks; with TASKs, those tasks.
"""

import os
import sys
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class GlueTask:
    """One GLUE task. Column indices may be negative (counted from the end)."""

    name: str
    folder: str                       # its folder in the GLUE data (GLUE_DIR/FOLDER/train.tsv)
    input0: int
    input1: Optional[int]             # None: a single-sentence task
    label: int
    num_classes: int                  # 1: regression (STS-B's similarity score)
    epochs: int
    metric: str = "accuracy"          # picks the best checkpoint
    shown: tuple = ("accuracy",)      # the metrics a report shows, read from the best evaluation
    report_flags: tuple = ()          # the fairseq-train flags that log the metric
    dev_file: str = "dev.tsv"
    header: bool = True
    columns: Optional[int] = None     # the column count of a file without a header

    @property
    def regression(self):
        return self.num_classes == 1

    def files(self, glue_dir):
        """``{"train": path, "valid": path}``: the task's tsv files under ``glue_dir``."""
        folder = os.path.join(glue_dir, self.folder)
        return {"train": os.path.join(folder, "train.tsv"), "valid": os.path.join(folder, self.dev_file)}

    def fairseq_train_args(self):
        """The fairseq-train flags of the task's head and metric."""
        return (["--num-classes", str(self.num_classes), "--best-checkpoint-metric", self.metric,
                 *self.report_flags] + (["--regression-target"] if self.regression else []))


GLUE_TASKS = {task.name: task for task in (
    GlueTask("CoLA", "CoLA", input0=3, input1=None, label=1, num_classes=2, epochs=10, metric="mcc",
             shown=("mcc",), report_flags=("--report-mcc",), header=False, columns=4),
    GlueTask("SST-2", "SST-2", input0=0, input1=None, label=1, num_classes=2, epochs=10),
    GlueTask("MRPC", "MRPC", input0=3, input1=4, label=0, num_classes=2, epochs=10, metric="f1",
             shown=("f1", "accuracy"), report_flags=("--report-acc-and-f1",)),
    GlueTask("STS-B", "STS-B", input0=7, input1=8, label=-1, num_classes=1, epochs=10,
             metric="pearson_and_spearman", shown=("pearson", "spearman"),
             report_flags=("--report-pearson-and-spearman",)),
    GlueTask("QQP", "QQP", input0=3, input1=4, label=5, num_classes=2, epochs=5, metric="f1",
             shown=("f1", "accuracy"), report_flags=("--report-acc-and-f1",)),
    GlueTask("MNLI", "MNLI", input0=8, input1=9, label=-1, num_classes=3, epochs=5,
             dev_file="dev_matched.tsv"),
    GlueTask("MNLI-mm", "MNLI", input0=8, input1=9, label=-1, num_classes=3, epochs=5,
             dev_file="dev_mismatched.tsv"),
    GlueTask("QNLI", "QNLI", input0=1, input1=2, label=3, num_classes=2, epochs=5),
    GlueTask("RTE", "RTE", input0=1, input1=2, label=3, num_classes=2, epochs=10),
    GlueTask("WNLI", "WNLI", input0=1, input1=2, label=3, num_classes=2, epochs=10),
)}


def describe(task):
    """One line of the table: task, files, classes, metric, epochs."""
    kind = "regression" if task.regression else f"{task.num_classes} classes"
    return (f"{task.name:8} {task.folder}/train.tsv, {task.folder}/{task.dev_file}; {kind}; "
            f"metric {task.metric}; {task.epochs} epochs")


def main(argv=None):
    names = (sys.argv[1:] if argv is None else argv) or list(GLUE_TASKS)
    unknown = [name for name in names if name not in GLUE_TASKS]
    if unknown:
        print(f"unknown GLUE task {' '.join(unknown)!r} (known: {', '.join(GLUE_TASKS)})", file=sys.stderr)
        return 2
    print("\n".join(describe(GLUE_TASKS[name]) for name in names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
