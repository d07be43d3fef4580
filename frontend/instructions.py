"""The steps shown to writers and validators, generated from the task and what the API served.

The numbers (tries per prompt, sentences in the batch), the labels (with their display names)
and the buttons named here are the ones the pages use: the button texts are constants of this
module that the pages put on their buttons, so instructions and interface cannot drift apart.
The task's own free-text ``instructions`` / ``validator_instructions`` follow as an extra
paragraph (what the labels mean, examples, rules).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from frontend import render

CHECK = "Check with the model"
INSPECT = "Inspect"
SKIP = "Switch to next prompt"
SUBMIT = "Submit"
CONFIRM_YES = "Yes, I confirm that I judge this sentence to be {wanted}."
CONFIRM_NO = "No, I judge this sentence to be {others}."
SAVE_LABEL = "Save label"
EDITOR = "Your sentence"


def listing(labels: Sequence[str], names: Mapping[str, str], last: str = "or") -> str:
    """``**Positive**, **Negative** or **No sentiment**`` (display names, escaped, in bold)."""
    shown = [f"**{render.escape_markdown(render.label_name(label, names))}**" for label in labels]
    if len(shown) <= 1:
        return "".join(shown)
    return f"{', '.join(shown[:-1])} {last} {shown[-1]}"


def writer_steps(
    labels: Sequence[str], names: Mapping[str, str], tries: int, *, multi_label: bool, prompt: bool | None = None
) -> str:
    """The writer's steps in the order the page asks for them: edit, check, confirm, submit.
    ``prompt``: whether the assignment has an inspirational prompt (None: not known yet, the quiz)."""
    start = {
        True: "Edit the prompt",
        False: "Write your sentence",
        None: "Edit the prompt (or write your own sentence)",
    }
    what = "label set" if multi_label else "label"
    try_word = "try" if tries == 1 else "tries"
    return "\n".join(
        [
            "### How it works",
            "",
            f"1. {start[prompt]} in **{EDITOR}** so that a person would give it "
            f"your goal {what}. The labels are {listing(labels, names, 'and')}.",
            f"2. Press **{CHECK}**. Each check uses one of your **{tries} {try_word}** for this prompt; the "
            f"model's prediction and its probability for each label appear below. **{INSPECT}** shows which "
            "words drive the prediction and uses no try.",
            f"3. When the model predicts another {what} than your goal, you have fooled it. Then you must say "
            "whether *you* judge the sentence to have your goal: **Yes, I confirm ...** or **No, I judge this "
            "sentence to be ...**.",
            f"4. After confirming, press **{SUBMIT}**. If the model is still right after all {tries} "
            f"{try_word}, you can submit your last sentence as it is. **{SKIP}** leaves this prompt without "
            "submitting.",
        ]
    )


def validator_steps(
    labels: Sequence[str],
    names: Mapping[str, str],
    batch_size: int,
    *,
    multi_label: bool,
    exclusive: Sequence[str] = (),
) -> str:
    """The validator's steps for the batch the API served (``batch_size`` sentences)."""
    sentences = "sentence" if batch_size == 1 else "sentences"
    if multi_label:
        choose = f"choose **every** label that applies from {listing(labels, names, 'and')}"
        alone = [label for label in exclusive if label in labels]
        if alone:
            choose += f" ({listing(alone, names)} only on its own)"
    else:
        choose = f"choose one label: {listing(labels, names)}"
    return "\n".join(
        [
            f"This batch has **{batch_size} {sentences}** written by other people. For each one, {choose}, "
            f"then press **{SAVE_LABEL}**. A saved label cannot be changed.",
            "",
            "Tick the flag box for spam, adverts, personal data or text that is not a real sentence.",
        ]
    )


def with_task_text(steps: str, task_text: str | None) -> str:
    """The generated steps, then the task's own instructions (Markdown written by the researcher)."""
    return f"{steps}\n\n{task_text}" if task_text and task_text.strip() else steps
