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
from rcn_fast.data.open_domain import OPEN_FIELD_MAPS, OpenFieldMap, OpenQuestion, load_open_questions
from rcn_fast.data.open_domain import exact_match, normalize_answer, string_em
from rcn_fast.data.questions import MCQuestion
from rcn_fast.data.yes_no import is_yes_no, load_yes_no_questions, yes_no_question

__all__ = [
    "MCQuestion", "load_questions", "read_jsonl", "load_hf", "FieldMap", "HF_FIELD_MAPS",
    "DataFormatError", "parse_csqa_record", "convert_record",
    "yes_no_question", "load_yes_no_questions", "is_yes_no",
    "OpenQuestion", "OpenFieldMap", "OPEN_FIELD_MAPS", "load_open_questions", "normalize_answer", "string_em",
    "exact_match",
]
