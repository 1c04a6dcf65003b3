"""The prompt doctor's role checks: tool-role tags in a rendered chat prompt vs ``tool``
messages vs assistant tool calls, and tool output rendered as user turns (tool results rendered
under another role make the model take tool output for new user input)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hermes_async.prompt import ROLE_TABLE, InspectedPrompt, is_tool_tag, role_tags

_USER_WORDS = tuple(raw for raw, role in ROLE_TABLE.items() if role == "user")


@dataclass(frozen=True)
class RoleCheck:
    """Tool-role figures of one rendered chat prompt: tool tags vs tool messages vs calls."""

    tool_messages: int
    tool_calls: int
    tool_tags: int
    user_messages: int
    user_tags: int

    @property
    def problem(self) -> str | None:
        """``tool_as_user``: tool results came out as user turns (no tool tag at all, and the
        extra user tags account for them); ``tool_tags``: tool tags differ from tool messages;
        ``tool_calls``: assistant tool calls differ from tool results; None when consistent."""
        if (self.tool_messages and not self.tool_tags
                and self.user_tags >= self.user_messages + self.tool_messages):
            return "tool_as_user"
        if self.tool_tags != self.tool_messages:
            return "tool_tags"
        if self.tool_calls and self.tool_calls != self.tool_messages:
            return "tool_calls"
        return None


def check_roles(inspected: InspectedPrompt) -> RoleCheck:
    """The role figures of one assembled chat prompt (its role tags counted as ``render`` does)."""
    prompt = inspected.prompt
    tags = role_tags(inspected)
    return RoleCheck(
        tool_messages=prompt.role_counts.get("tool", 0),
        tool_calls=sum(len(m.tool_calls) for m in inspected.messages),
        tool_tags=sum(n for tag, n in tags.items() if is_tool_tag(tag)),
        user_messages=prompt.role_counts.get("user", 0),
        user_tags=sum(n for tag, n in tags.items() if tag.lower().endswith(_USER_WORDS)))


@dataclass(frozen=True)
class RoleFinding:
    """A prompt whose tool roles do not add up."""

    line: int
    problem: str
    check: RoleCheck


@dataclass
class RoleTotals:
    """The role figures of a whole file: chat prompts, those with tools, the tool figures
    summed, and one finding per prompt whose tool roles do not add up."""

    chat_prompts: int = 0
    prompts_with_tools: int = 0
    tool_messages: int = 0
    tool_calls: int = 0
    tool_tags: int = 0
    findings: list[RoleFinding] = field(default_factory=list)

    def add(self, line: int, check: RoleCheck) -> None:
        """Count the chat prompt of input line ``line``."""
        self.chat_prompts += 1
        self.prompts_with_tools += bool(check.tool_messages or check.tool_calls
                                        or check.tool_tags)
        self.tool_messages += check.tool_messages
        self.tool_calls += check.tool_calls
        self.tool_tags += check.tool_tags
        if check.problem is not None:
            self.findings.append(RoleFinding(line, check.problem, check))
