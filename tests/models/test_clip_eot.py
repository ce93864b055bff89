"""``CLIPConfig.eot_token_id``: "eot" pooling at the first position of that id in each row
(transformers' CLIP rule), checked by indexing the text tower's hidden states by hand."""

import torch

import multimodal as mm


def test_eot_token_id_pools_at_first_occurrence_else_last_real_token():
    torch.manual_seed(0)
    clip = mm.CLIP(mm.CLIPConfig(eot_token_id=9)).eval()
    ids = torch.tensor([[1, 9, 4, 9, 5], [2, 3, 4, 5, 6], [1, 2, 9, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0], [1, 1, 1, 0, 0]])
    with torch.no_grad():
        hidden = clip.text_model(ids, mask)
        # row 0: first 9 at 1; row 1: no 9 -> last real token 3; row 2: 9 at 2
        want = clip.text_projection(hidden[torch.arange(3), torch.tensor([1, 3, 2])])
        torch.testing.assert_close(clip.encode_text(ids, mask, normalize=False), want)
        clip.config.eot_token_id = None  # the default: the last real token of each row
        want = clip.text_projection(hidden[torch.arange(3), torch.tensor([4, 3, 2])])
        torch.testing.assert_close(clip.encode_text(ids, mask, normalize=False), want)
