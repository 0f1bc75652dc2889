/* tests/unit/test_builtins.c — the runtime's builtin list (runtime/builtins.def) against the
   IR's op list (ir/ops.def): every builtin that lowers an op one to one carries that op's
   text name, and no two builtins claim the same op.  The counts of operands and results are
   checked at build time (codegen/lower_common.c's static assertions). */
#include <string.h>

#include "codegen/lower_common.h"
#include "tests/unit/check.h"

int main(void) {
  int claimed[OP_COUNT];
  for (int k = 0; k < OP_COUNT; k++) claimed[k] = -1;
  int one_to_one = 0;
  for (int b = 0; b < RT_B_COUNT; b++) {
    const char *name = rt_builtins[b].name;
    check(name != NULL, "builtin %d has no name", b);
    if (!name) continue;
    int op = cg_builtin_op(b);
    if (op < 0) continue;
    check(op < OP_COUNT, "builtin %s: op %d out of range", name, op);
    if (op >= OP_COUNT) continue;
    one_to_one++;
    check(!strcmp(name, op_info((OpKind)op)->name), "builtin %d is named '%s', its op '%s'", b, name,
          op_info((OpKind)op)->name);
    check(claimed[op] < 0, "builtins %d and %d both claim op '%s'", claimed[op], b, name);
    claimed[op] = b;
  }
  check(!strcmp(rt_builtin_name(RT_B_COUNT), "?") && cg_builtin_op(RT_B_COUNT) == -1, "past the table");
  /* copy, fill, collective_start, collective_wait are the runtime-only ones today */
  check(one_to_one == RT_B_COUNT - 4, "%d builtins lower an op one to one, expected %d", one_to_one, RT_B_COUNT - 4);
  printf("%d passed, %d failed\n", n_pass, n_fail);
  return n_fail ? 1 : 0;
}
