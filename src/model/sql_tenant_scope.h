#pragma once

// Whether a sql step's statement touches only its own tenant's rows: the rule a server
// with `tenants:` holds every statement to, read from the tokens alone. No I/O.
//
// Business tables carry a `tenant` column; Waystone binds :tenant to the instance's
// tenant. A statement is scoped when it names one table and
//   INSERT INTO t (..., tenant, ...) VALUES (..., :tenant, ...)[, (...)]
//          [ON CONFLICT ... DO NOTHING | DO UPDATE SET ... WHERE tenant = :tenant [AND ...]]
//   UPDATE t SET ... WHERE tenant = :tenant [AND ...]
//   DELETE FROM t WHERE tenant = :tenant [AND ...]
//   SELECT ... FROM t WHERE tenant = :tenant [AND ...]      (or SELECT with no FROM)
// with RETURNING, ORDER BY, LIMIT and the like after the WHERE. The tenant's condition
// comes first and the rest of the WHERE has no OR outside parentheses, so the whole is
// "tenant = :tenant AND (the rest)": no row of another tenant matches. `t.tenant` with
// the table's name or alias counts; `excluded.tenant` does not. Refused, as what the check
// cannot see through: a second table (JOIN, a comma, UPDATE ... FROM, DELETE ... USING), a
// subquery or INSERT ... SELECT, WITH, UNION/INTERSECT/EXCEPT, a SET that names `tenant`
// (a row moved to another tenant), OR REPLACE (SQLite deletes the row it conflicts with).
// Views, triggers and functions of the deployment's own run as written: they are the
// deployment's to keep per tenant (docs/definition-reference.md#sql).

#include <string>
#include <vector>

#include "model/sql_statement.h"

namespace waystone {

// Returns "" when `tokens` (SqlStatement::tokens) form a scoped statement, else what is
// missing or in the way, in words for the definition's author.
std::string TenantScopeProblem(const std::vector<SqlToken>& tokens);

}  // namespace waystone
