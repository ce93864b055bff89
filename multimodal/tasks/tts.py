"""Text-to-speech, VALL-E style: one task trains the AR and the NAR codec language model.

Batches (:class:`multimodal.data.tts.TTSDataModule`): ``phonemes`` (B, P) + ``phoneme_lengths``,
``prompt`` (B, Q, Tp) + ``prompt_lengths`` (codec tokens of another utterance of the same
voice), ``codes`` (B, Q, T) + ``code_lengths`` (the target utterance), ``speaker``.

Each step:

* the prompt is cut to a random window of at most ``max_prompt_frames`` frames
  (``max_prompt_seconds`` x the codec's frame rate), as in VALL-E's 3-second prompts;
* AR loss: mean cross-entropy of the target's codebook-1 tokens and the end-of-speech token,
  ``L_AR = -1/(sum_b T_b + 1) sum_b sum_{t<=T_b+1} log p(c_{b,t} | phonemes, prompt, c_{b,<t})``
  (phonemes, prompt and padding are never targets, :meth:`CodecAR.teacher_forcing`);
* NAR loss: one codebook ``q_b ~ U{2..Q}`` per example, mean cross-entropy of ``c_{b,q_b}``
  over the real frames (validation uses ``q_b = 2 + b mod (Q - 1)``, so it is reproducible);
* ``loss = L_AR + nar_weight * L_NAR``. Logged: ``{train,val}/loss``, ``/ar_loss``,
  ``/nar_loss``, ``/ar_acc`` and ``/nar_acc`` (token accuracy of the argmax).

The phoneme tokenizer and the codec come from the data module (``phoneme_tokenizer``,
``codec``) and travel in the checkpoint (``checkpoint["tts"]``), so
:func:`multimodal.synthesize` needs nothing but the checkpoint file.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from multimodal.checkpoints import (
    BUNDLE_KEY,
    TTSBundle,
    bundle_state,
    codec_from_state,
    tokenizer_from_state,
)
from multimodal.models.codec_lm import IGNORE_INDEX, CodecLM, nar_loss
from multimodal.tasks.base import ModelTask
from multimodal.tasks.optim import OptimizerConfig
from multimodal.tokenizers.codec import MelRVQCodec
from multimodal.tokenizers.phonemes import PhonemeTokenizer

__all__ = ["TTSTask", "crop_prompt"]


def crop_prompt(prompt: Tensor, lengths: Tensor, max_frames: int,
                generator: torch.Generator | None = None,
                random: bool = True) -> tuple[Tensor, Tensor]:
    """Each row's prompt (B, Q, Tp) cut to a window of at most ``max_frames`` real frames
    (a random start with ``random``, else the first frames); returns (B, Q, <= max_frames)
    and the new lengths."""
    new_len = lengths.clamp(max=max_frames)
    width = int(new_len.max()) if new_len.numel() else 0
    slack = (lengths - new_len).float()
    if random:
        u = torch.rand(lengths.shape, generator=generator).to(lengths.device)
        start = (u * (slack + 1)).floor().long().clamp(max=(lengths - new_len))
    else:
        start = torch.zeros_like(lengths)
    index = start[:, None] + torch.arange(width, device=prompt.device)[None]
    index = index.clamp(max=max(prompt.shape[-1] - 1, 0))
    out = prompt.gather(2, index[:, None].expand(-1, prompt.shape[1], -1))
    pad = torch.arange(width, device=prompt.device)[None] >= new_len[:, None]
    return out.masked_fill(pad[:, None], 0), new_len


class TTSTask(ModelTask):
    """Train a :class:`CodecLM` (AR + NAR) on TTS batches; see the module doc."""

    accepts = (CodecLM,)
    optimizer_defaults = OptimizerConfig(lr=1e-3, weight_decay=0.01,
                                         warmup_fraction=0.05, min_lr_ratio=0.05)
    model_sources = ("model", "preset")

    def __init__(
        self,
        model: CodecLM | None = None,
        max_prompt_seconds: float = 1.5,
        nar_weight: float = 1.0,
        **kwargs: Any,
    ) -> None:
        if not max_prompt_seconds > 0:
            raise ValueError(f"max_prompt_seconds must be > 0, got {max_prompt_seconds}")
        super().__init__(model, pretrained=None, **kwargs)  # model_sources: no pretrained
        self.save_hyperparameters(ignore=["model"])
        self.phoneme_tokenizer: PhonemeTokenizer | None = None
        # running mean of target frames per phoneme (bounds generation length at inference);
        # the sums stay on the batch's device (no host sync a step) until read
        self._frames: Tensor | float = 0.0
        self._phones: Tensor | float = 0.0
        self.frames_per_phoneme = 0.0
        self._codec: list[MelRVQCodec] = []  # in a list: not a submodule (no state_dict keys)

    @property
    def codec(self) -> MelRVQCodec | None:
        """The data's codec (kept out of the task's modules: it travels as
        ``checkpoint["tts"]``, not in ``state_dict``)."""
        return self._codec[0] if self._codec else None

    # -- data plumbing -------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        dm = self.datamodule
        if self.phoneme_tokenizer is None or self.codec is None:
            if dm is None or getattr(dm, "codec", None) is None \
                    or getattr(dm, "phoneme_tokenizer", None) is None:
                raise ValueError("TTSTask takes its phoneme tokenizer and codec from the data "
                                 "module (.phoneme_tokenizer, .codec): use TTSDataModule")
            self.attach(dm.phoneme_tokenizer, dm.codec)

    def attach(self, tokenizer: PhonemeTokenizer, codec: MelRVQCodec) -> None:
        """Use ``tokenizer`` and ``codec``; their sizes must match the model's config."""
        cfg = self.model.config
        problems = []
        if codec.codebook_size != cfg.codebook_size:
            problems.append(f"model.config.ar/nar.codebook_size={cfg.codebook_size} but the "
                            f"codec has K={codec.codebook_size}")
        if codec.num_codebooks != cfg.num_codebooks:
            problems.append(f"model.config.nar.num_codebooks={cfg.num_codebooks} but the "
                            f"codec has Q={codec.num_codebooks}")
        if tokenizer.vocab_size > cfg.num_phonemes:
            problems.append(f"model.config.ar/nar.num_phonemes={cfg.num_phonemes} is below the "
                            f"phoneme tokenizer's vocabulary ({tokenizer.vocab_size})")
        if problems:
            raise ValueError("; ".join(problems) + ": set them in the config's model section")
        self.phoneme_tokenizer, self._codec = tokenizer, [codec]

    @property
    def max_prompt_frames(self) -> int:
        if self.codec is None:
            raise ValueError("no codec yet: call setup() (fit does) or attach()")
        return max(1, round(self.hparams.max_prompt_seconds * self.codec.frame_rate))

    def bundle(self) -> TTSBundle:
        """The model with its tokenizer and codec, for :func:`multimodal.synthesize`."""
        if self.phoneme_tokenizer is None or self.codec is None:
            raise ValueError("no tokenizer / codec yet: call setup() (fit does) or attach()")
        return TTSBundle(self.model, self.phoneme_tokenizer, self.codec,
                         self.max_prompt_frames, self._frames_per_phoneme())

    def _frames_per_phoneme(self) -> float:
        phones = float(self._phones)
        if phones > 0:
            return float(self._frames) / phones
        return self.frames_per_phoneme or 4.0

    # -- losses --------------------------------------------------------------------------
    def losses(self, batch: dict[str, Tensor], stage: Tensor | None = None,
               random_crop: bool = True) -> dict[str, Tensor]:
        """``ar_loss``, ``nar_loss``, ``loss`` and the token accuracies of one batch."""
        ph, ph_len = batch["phonemes"], batch["phoneme_lengths"]
        codes, code_len = batch["codes"], batch["code_lengths"]
        prompt, prompt_len = crop_prompt(batch["prompt"], batch["prompt_lengths"],
                                         self.max_prompt_frames, random=random_crop)
        inputs, labels = self.model.ar.teacher_forcing(ph, ph_len, prompt[:, 0], prompt_len,
                                                       codes[:, 0], code_len)
        logits = self.model.ar(inputs)
        ar = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(),
                             ignore_index=IGNORE_INDEX)
        known = labels != IGNORE_INDEX
        ar_acc = (logits.argmax(-1) == labels)[known].float().mean()
        q = self.model.config.num_codebooks
        if stage is None:
            stage = torch.randint(1, q, (ph.shape[0],), device=ph.device)
        nar_logits = self.model.nar(ph, ph_len, prompt, prompt_len, codes, code_len, stage)
        nar = nar_loss(nar_logits, codes, code_len, stage)
        target = codes.gather(1, stage[:, None, None].expand(-1, 1, codes.shape[-1]))[:, 0]
        real = torch.arange(codes.shape[-1], device=codes.device)[None] < code_len[:, None]
        nar_acc = (nar_logits.argmax(-1) == target)[real].float().mean()
        return {"loss": ar + self.hparams.nar_weight * nar, "ar_loss": ar, "nar_loss": nar,
                "ar_acc": ar_acc, "nar_acc": nar_acc}

    def _log(self, out: dict[str, Tensor], split: str, batch_size: int) -> None:
        for key, value in out.items():
            if split == "train":
                self.log_train(f"{split}/{key}", value, prog_bar=key in ("loss", "ar_acc"),
                               batch_size=batch_size)
            else:  # every rank's examples (see ModelTask.log_mean)
                self.log_mean(f"{split}/{key}", value, batch_size,
                              prog_bar=key in ("loss", "ar_acc"))

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        out = self.losses(batch)
        self._frames = self._frames + batch["code_lengths"].sum().float()
        self._phones = self._phones + batch["phoneme_lengths"].sum().float()
        self._log(out, "train", batch["phonemes"].shape[0])
        return out["loss"]

    def _eval(self, batch: dict[str, Tensor], split: str) -> None:
        b = batch["phonemes"].shape[0]
        q = self.model.config.num_codebooks
        stage = 1 + torch.arange(b, device=batch["phonemes"].device) % (q - 1)
        self._log(self.losses(batch, stage, random_crop=False), split, b)

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._eval(batch, "val")

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._eval(batch, "test")

    # -- the tokenizer and codec travel with the checkpoint ------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        if self.phoneme_tokenizer is not None and self.codec is not None:
            checkpoint[BUNDLE_KEY] = bundle_state(self.phoneme_tokenizer, self.codec,
                                                  self.max_prompt_frames,
                                                  self._frames_per_phoneme())

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        state = checkpoint.get(BUNDLE_KEY)
        if isinstance(state, dict):
            self.phoneme_tokenizer = tokenizer_from_state(state)
            self._codec = [codec_from_state(state)]
            self.frames_per_phoneme = float(state["frames_per_phoneme"])
