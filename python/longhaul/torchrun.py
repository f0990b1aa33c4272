"""torchrun, for Debian's torch 1.13 on Python 3.11: `python3 -m longhaul.torchrun --nproc_per_node 2 SCRIPT ...`
takes torchrun's arguments and runs it.

torch 1.13's torchrun reads its --redirects and --tee values by iterating over an IntFlag, which since Python 3.11
skips the zero and multi-bit members, so /usr/bin/torchrun fails on every start with "'NoneType' object has no
attribute 'get'". This reads them with Std(int(value)) instead and changes nothing else.
"""
import re

from torch.distributed.elastic.multiprocessing import api


def _from_str(cls, vm):
    if re.match(api._VALUE_REGEX, vm):
        return cls(int(vm))
    if re.match(api._MAPPING_REGEX, vm):
        return {int(i): cls(int(v)) for i, v in (m.split(":") for m in vm.split(","))}
    raise ValueError(f"{vm} does not match: <{api._VALUE_REGEX}> or <{api._MAPPING_REGEX}>")


api.Std.from_str = classmethod(_from_str)

if __name__ == "__main__":
    from torch.distributed.run import main

    main()
