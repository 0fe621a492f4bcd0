"""One save and one load for every kind of trained part (`core.saved_parts.SavedPart`): a kind declares its
section's fields, how it is built from them and how it takes its tensors; the folder is verified, the tensors are
checked against the part its section describes, and a shipped artefact loads and saves back byte for byte."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from midlens.core.errors import ArtefactError
from midlens.core.saved_parts import DERIVED, SavedPart
from midlens.generators.answering.support import METHOD_PLAIN, METHOD_VERIFIED, SupportModel
from midlens.generators.attention.delta import LoRADelta
from midlens.generators.methods.channel_scaling import NAME as CHANNEL_SCALING
from midlens.generators.methods.channel_scaling import ChannelChoice
from midlens.generators.methods.moice import MoiceRouters
from midlens.generators.models.shipped import SHIPPED

KINDS = {"mudaf": LoRADelta, "pos2distill": LoRADelta, "moice": MoiceRouters, CHANNEL_SCALING: ChannelChoice}


def _resaved(folder: Path, part: SavedPart, tmp_path: Path) -> Path:
    """`part` saved again with the rest of `folder`'s meta.json (what its run recorded; the derived keys are
    written by the save)."""
    meta = json.loads((folder / "meta.json").read_text())
    rest = {k: v for k, v in meta.items() if k not in DERIVED and k != part.SECTION.key}
    return part.save(tmp_path / folder.parent.name / folder.name, rest)


def _same_bytes(a: Path, b: Path) -> bool:
    return all((a / f).read_bytes() == (b / f).read_bytes() for f in ("meta.json", "weights.safetensors"))


@pytest.mark.parametrize("folder", sorted(SHIPPED.glob(f"{CHANNEL_SCALING}/*")), ids=lambda p: p.name)
def test_a_shipped_channel_choice_loads_and_saves_back_byte_for_byte(folder, tmp_path):
    """The section a ChannelChoice writes is the generic one (its SECTION's fields, read off the part)."""
    sha = json.loads((folder / "meta.json").read_text())["base_model_sha256"]
    choice, artefact = ChannelChoice.load(folder, CHANNEL_SCALING, sha)
    assert choice.config() == artefact.meta["scaling"]
    assert _same_bytes(_resaved(folder, choice, tmp_path), folder)


SUPPORT = sorted([*SHIPPED.glob(f"{METHOD_PLAIN}/*"), *SHIPPED.glob(f"{METHOD_VERIFIED}/*")])


@pytest.mark.parametrize("folder", SUPPORT, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_shipped_support_model_loads_and_saves_back_byte_for_byte(folder, tmp_path):
    """Its section (features, threshold, the methods it was fitted on) builds it, its tensors are its coefficients."""
    sha = json.loads((folder / "meta.json").read_text())["base_model_sha256"]
    model, _ = SupportModel.load(folder, folder.parent.name, sha)
    assert len(model.coef) == len(model.features) and model.name == folder.name
    assert _same_bytes(_resaved(folder, model, tmp_path), folder)


def test_every_artefact_shipped_for_smollm2_loads_and_saves_back_byte_for_byte(loaded, tmp_path):
    """LoRA deltas (MuDAF, its alpha=0 ablation, Pos2Distill), MoICE routers and the channel choice, through the
    one load: the tensors land where the part's own names say, frozen, and saving the part writes the shipped
    files again (a hand-written load that misplaced a tensor or dropped a field would not)."""
    folders = [f for f in sorted(SHIPPED.glob("*/*")) if f.name.startswith(loaded.name) and f.parent.name in KINDS]
    assert {f.parent.name for f in folders} == set(KINDS)
    for folder in folders:
        kind = KINDS[folder.parent.name]
        context = {} if kind is ChannelChoice else {"model": loaded.model}
        part, artefact = kind.load(folder, folder.parent.name, loaded.sha256, **context)
        assert part.config() == artefact.meta[kind.SECTION.key], folder
        assert not any(p.requires_grad for p in _parameters(part)), folder
        assert all(torch.equal(part.tensors()[k], v) for k, v in artefact.tensors.items()), folder
        assert _same_bytes(_resaved(folder, part, tmp_path), folder), folder


def _parameters(part: SavedPart) -> list[torch.nn.Parameter]:
    """What a trained part would train: a delta's factors, each MoICE layer's router; a channel choice has none."""
    if isinstance(part, MoiceRouters):
        return [p for scheme in part.schemes for p in scheme.parameters()]
    return list(part.parameters()) if isinstance(part, torch.nn.Module) else []


def _channel_folder(tmp_path: Path) -> Path:
    folder = sorted(SHIPPED.glob(f"{CHANNEL_SCALING}/*"))[0]
    sha = json.loads((folder / "meta.json").read_text())["base_model_sha256"]
    choice, _ = ChannelChoice.load(folder, CHANNEL_SCALING, sha)
    return _resaved(folder, choice, tmp_path)


def _edit(folder: Path, change) -> str:
    meta = json.loads((folder / "meta.json").read_text())
    change(meta)
    (folder / "meta.json").write_text(json.dumps(meta))
    return meta["base_model_sha256"]


def test_the_tensors_must_be_the_ones_the_section_describes(tmp_path):
    """The section says how many layers are scaled; the verified weights hold one index per layer. A section edited
    to name another count is refused by the shapes its part holds, before any value is compared."""
    folder = _channel_folder(tmp_path)
    sha = _edit(folder, lambda meta: meta["scaling"]["layers"].append(0))
    with pytest.raises(ArtefactError, match=r"does not fit this model .*layers: has \[\d+\], needs \[\d+\]"):
        ChannelChoice.load(folder, CHANNEL_SCALING, sha)


def test_a_section_the_part_cannot_be_built_from_is_refused_by_the_kind(tmp_path):
    folder = _channel_folder(tmp_path)
    sha = _edit(folder, lambda meta: meta["scaling"].update(layers=[]))
    with pytest.raises(ArtefactError, match="scaling.layers must be a non-empty list of layer indices"):
        ChannelChoice.load(folder, CHANNEL_SCALING, sha)
    sha = _edit(folder, lambda meta: meta["scaling"].update(layers=[1], channel=True))
    with pytest.raises(ArtefactError, match=r"'scaling' field\(s\) missing or of the wrong type: channel"):
        ChannelChoice.load(folder, CHANNEL_SCALING, sha)


def test_a_part_that_does_not_say_how_it_takes_its_tensors_is_told_so():
    class Bare(SavedPart):
        pass

    with pytest.raises(NotImplementedError, match="Bare does not say how it takes its saved tensors"):
        Bare().with_tensors({}, None)


def test_every_kind_loads_through_the_one_load():
    """No kind overrides `load` (or `open`, which it verifies through): a checked support model loads as a
    support model does, as a delta or a router does, with the method it is saved under."""
    from midlens.generators.answering.check import CheckedSupportModel

    def kinds(cls: type) -> list[type]:
        return [cls, *(k for sub in cls.__subclasses__() for k in kinds(sub))]

    found = set(kinds(SavedPart)) - {SavedPart}
    assert {SupportModel, CheckedSupportModel, LoRADelta, MoiceRouters, ChannelChoice} <= found
    assert not [k.__name__ for k in found if {"load", "open"} & set(vars(k))]


# -- verified JSON artefacts: slot orders and retrieval-head scores ----------------------------------------------

JSON_FOLDERS = ("slot-orders", "retrieval-heads")


def test_every_shipped_json_artefact_is_recorded_and_verifies():
    """Each shipped slot order and head-score file has its sha256 in its folder's manifest and reads back as the
    very JSON the file holds."""
    from midlens.core.files import read_manifest
    from midlens.core.saved_parts import json_artefacts, read_json_artefact

    for name in JSON_FOLDERS:
        folder = SHIPPED / name
        files = json_artefacts(folder)
        assert files and set(read_manifest(folder)["files"]) == {p.name for p in files}
        for path in files:
            assert read_json_artefact(path, "file") == json.loads(path.read_text())


def test_a_json_artefact_is_refused_when_edited_or_unrecorded_naming_the_file_and_the_fix(tmp_path):
    from midlens.core.files import MANIFEST
    from midlens.core.saved_parts import read_json_artefact, record_json_artefact, save_json_artefact

    record = {"order": [2, 1], "model_sha256": "x"}
    path = save_json_artefact(tmp_path / "a.json", record)
    save_json_artefact(tmp_path / "b.json", {"order": [1]})  # a second file keeps the first one's entry
    assert path.read_text() == json.dumps(record, indent=1) + "\n"
    assert read_json_artefact(path, "slot-order file") == record
    path.write_text(path.read_text().replace('"x"', '"y"'))  # same size, other bytes
    edited = (
        rf"{re.escape(str(path))}: sha256 .* does not match .*/{MANIFEST} \(damaged or edited file\).*, or write one"
    )
    with pytest.raises(ArtefactError, match=edited):
        read_json_artefact(path, "slot-order file", "write one")
    hand = tmp_path / "hand.json"
    hand.write_text(json.dumps(record))
    unrecorded = rf"{re.escape(str(hand))}: no sha256 is recorded .*; write one, or, if you trust its content, .*"
    with pytest.raises(ArtefactError, match=unrecorded + re.escape(f"record_json_artefact('{hand}')")):
        read_json_artefact(hand, "slot-order file", "write one")
    record_json_artefact(hand)
    assert read_json_artefact(hand, "slot-order file") == record
    assert read_json_artefact(tmp_path / "b.json", "slot-order file") == {"order": [1]}
    with pytest.raises(ArtefactError, match=r"not a slot-order file \(no such file\); write one"):
        read_json_artefact(tmp_path / "missing.json", "slot-order file", "write one")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(ArtefactError, match=r"not a JSON artefact \(not a JSON object\)"):
        record_json_artefact(tmp_path / "list.json")
