"""Screens: Setup, Runs, Live, Summary, Doctor, and the modals they open."""

from textual.app import ScreenStackError
from textual.screen import Screen


def on_top(screen: Screen[object]) -> bool:
    """Whether `screen` is the one the user sees: False while another covers it, and while the app tears
    its stack down (a timer can still fire then, and `app.screen` raises)."""
    try:
        return screen.app.screen is screen
    except ScreenStackError:
        return False
