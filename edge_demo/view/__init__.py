"""The head view: one self-contained HTML page of where every attention head looks.

`page` (`ViewData`, `write_html`) and `assets` (its CSS and JavaScript).
numpy and the standard library; imports `contract` only. The device app
(`--view`) and `keras-mha-heads view` both write it.
"""
