"""Screens: Setup, Runs, Live, Summary, Doctor, and the modals they open."""
