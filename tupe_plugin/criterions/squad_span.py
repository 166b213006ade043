"""``--criterion squad_span``: cross-entropy of the answer's start token plus that of its end token, halved
(BERT's SQuAD loss), with start, end and exact-span accuracy for fairseq-train/validate logs."""

import math

import torch.nn.functional as F
from fairseq import metrics
from fairseq.criterions import FairseqCriterion, register_criterion


@register_criterion("squad_span")
class SquadSpanCriterion(FairseqCriterion):
    def forward(self, model, sample, reduce=True):
        (start_logits, end_logits), _ = model(
            **sample["net_input"], span_head_name=self.task.cfg.span_head_name
        )
        padding = sample["net_input"]["src_tokens"].eq(self.padding_idx)
        start_logits = start_logits.float().masked_fill(padding, float("-inf"))
        end_logits = end_logits.float().masked_fill(padding, float("-inf"))
        starts, ends = sample["target"].unbind(dim=1)
        loss = (F.cross_entropy(start_logits, starts, reduction="sum")
                + F.cross_entropy(end_logits, ends, reduction="sum")) / 2
        start_hit = start_logits.argmax(dim=1).eq(starts)
        end_hit = end_logits.argmax(dim=1).eq(ends)
        sample_size = starts.numel()
        logging_output = {
            "loss": loss.data,
            "ntokens": sample["ntokens"],
            "nsentences": sample_size,
            "sample_size": sample_size,
            "start_correct": start_hit.sum().item(),
            "end_correct": end_hit.sum().item(),
            "span_correct": (start_hit & end_hit).sum().item(),
        }
        return loss, sample_size, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs):
        loss = sum(log.get("loss", 0) for log in logging_outputs)
        sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
        metrics.log_scalar("loss", loss / sample_size / math.log(2), sample_size, round=3)
        for name in ("start", "end", "span"):
            correct = sum(log.get(f"{name}_correct", 0) for log in logging_outputs)
            metrics.log_scalar(f"{name}_accuracy", 100.0 * correct / sample_size, sample_size, round=1)

    @staticmethod
    def logging_outputs_can_be_summed():
        return True
