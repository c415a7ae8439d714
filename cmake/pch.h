// Precompiled header shared by every target (LibTorch alone costs ~30 s per TU otherwise).
#pragma once
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>
