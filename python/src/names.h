// Names -> numerics enums for the bindings, failing with concord::InputError (concord.InputError
// in Python) that lists the names accepted — the names the CLI and docs use.
#pragma once

#include <string>
#include <vector>

#include "concord/numerics/quant_desc.h"

namespace concord::python {

// op: the Python function's name, put in front of the message ("[numerics.encode] ...").
numerics::Format format_named(const std::string& name, const char* op);
numerics::Rounding rounding_named(const std::string& name, const char* op);
numerics::Overflow overflow_named(const std::string& name, const char* op);
numerics::ScaleRule scale_rule_named(const std::string& name, const char* op);
// A preset name, an element format name or the canonical text.
numerics::QuantDesc desc_named(const std::string& text, const char* op);

std::vector<std::string> format_names();
std::vector<std::string> block_format_list();

}  // namespace concord::python
