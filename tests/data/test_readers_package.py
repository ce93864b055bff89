"""``multimodal.data.readers`` is a package of the readers of your own files: it answers the
names it had as one module, and the modules that moved into it (``audio_files``,
``text_files``, ``captions_files``) and the decoders the one image reader replaced warn,
naming the new place, and still answer for one release."""

from __future__ import annotations

import importlib
import sys
import warnings

import pytest

import multimodal.data.readers as readers
from multimodal.files import read_image

# the names multimodal.data.readers offered as a module (its __all__ then, and two more
# that other modules imported)
OLD_NAMES = ("CorruptFileError", "FileList", "PathArray", "PathArrayBuilder",
             "check_files_exist", "find_classes", "image_to_channels", "is_manifest",
             "read_labelled_manifest", "scan_class_folders", "undecodable_images")


def test_the_package_answers_the_old_names_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in OLD_NAMES:
            assert getattr(readers, name) is not None, name


@pytest.mark.parametrize("old,new,name", [
    ("multimodal.data.audio_files", "multimodal.data.readers.audio", "read_audio_files"),
    ("multimodal.data.text_files", "multimodal.data.readers.text", "read_text_documents"),
    ("multimodal.data.captions_files", "multimodal.data.readers.captions",
     "read_caption_files"),
])
def test_a_moved_module_warns_on_import_and_forwards(old, new, name):
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning,
                      match=rf"{old} is deprecated and will be removed in 0\.2: use {new}"):
        module = importlib.import_module(old)
    assert getattr(module, name) is getattr(importlib.import_module(new), name)
    with pytest.raises(AttributeError):
        module.no_such_name


@pytest.mark.parametrize("name", ["decode_image_file", "decode_image_bytes"])
def test_the_old_decoders_warn_and_are_the_one_reader(name):
    with pytest.warns(DeprecationWarning, match=r"multimodal\.files\.read_image"):
        assert getattr(readers, name) is read_image


def test_the_old_pipeline_preprocessor_name_warns():
    from multimodal.pipelines import inputs

    with pytest.warns(DeprecationWarning, match="measured_image_preprocessor"):
        assert inputs.data_image_preprocessor is inputs.measured_image_preprocessor
