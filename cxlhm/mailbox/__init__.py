"""The device's CXL mailbox: a spec-shaped register block in shared memory, a command
table (standard Identify / Logs / Identify Memory Device / Health / Poison commands,
and cxlhm's vendor hint commands), and a firmware thread that services the doorbell.

Modules, each owning one thing:
  registers          register layout, field codecs, the shared-memory RegisterFile
  opcodes            command opcodes            returncodes   spec return codes
  hints              HintKind: the hint numbers policies switch on
  payloads           every payload format (struct layouts / numpy dtypes) + decoders
  commands           the command table and the recipe for adding a command
  standard_commands  handlers of the spec commands
  hint_commands      handlers of the vendor hint commands (validation, delivery)
  background         background commands and their status register
  poison             the seam where the reliability work plugs in poison records
  service            Mailbox: the firmware thread
The host side is host_runtime/mailbox.py; docs/mailbox.md documents all of it.
"""
from cxlhm.mailbox.hints import HintKind
from cxlhm.mailbox.opcodes import Opcode
from cxlhm.mailbox.returncodes import CommandFailed, ReturnCode
from cxlhm.mailbox.service import Mailbox

__all__ = ["CommandFailed", "HintKind", "Mailbox", "Opcode", "ReturnCode"]
