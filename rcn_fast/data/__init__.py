"""Question records and loaders (local CommonsenseQA-layout files, Hugging Face datasets)."""

from rcn_fast.data.loaders import (
    HF_FIELD_MAPS,
    DataFormatError,
    FieldMap,
    convert_record,
    load_hf,
    load_questions,
    parse_csqa_record,
    read_jsonl,
)
from rcn_fast.data.questions import MCQuestion

__all__ = [
    "MCQuestion", "load_questions", "read_jsonl", "load_hf", "FieldMap", "HF_FIELD_MAPS",
    "DataFormatError", "parse_csqa_record", "convert_record",
]
