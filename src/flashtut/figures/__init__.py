"""Figures for the book, drawn by code (matplotlib). Each chapter's figures live in their own
module here; ``style`` holds what they share."""
