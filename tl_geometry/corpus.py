"""Corpora: text in, token windows out, and the corpus run (streamed, resumable, merged across processes).

    from tl_geometry.corpus import read_corpus, analyze_corpus
"""

from tl_geometry.corpus_input.plain_text import default_text, read_text_files
from tl_geometry.corpus_input.readers import CorpusReport
from tl_geometry.corpus_input.token_windows import Window, WindowStream, read_corpus, text_windows, window_documents
from tl_geometry.runs.corpus_run import analyze_corpus

__all__ = [
    "CorpusReport",
    "Window",
    "WindowStream",
    "analyze_corpus",
    "default_text",
    "read_corpus",
    "read_text_files",
    "text_windows",
    "window_documents",
]
