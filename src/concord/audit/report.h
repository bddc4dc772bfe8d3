// The HTML report of a contract measurement (and check): per-slice table, flip rate vs margin
// per slice, osc distribution per slice, the fitted contract and any violations. One file,
// inline SVG (svg.h), opens offline. Written atomically.
#pragma once

#include <string>

#include "concord/audit/contract.h"

namespace concord::audit {

void write_contract_report(const std::string& path, const Measurement& m,
                           const Contract* contract, const CheckResult* check);

}  // namespace concord::audit
