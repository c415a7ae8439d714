// Tests that need a sentencepiece tokenizer skip, with the reason printed, in builds where
// the backend cannot run (AddressSanitizer: dlopen(RTLD_DEEPBIND), see vlm/text/sp_tokenizer.h).
#pragma once
#include <gtest/gtest.h>

#include <string>

#include "vlm/text/sp_tokenizer.h"

#define VLMTRAIN_TEST_REQUIRE_SENTENCEPIECE()                                       \
  do {                                                                        \
    std::string vlmtest_sp_why;                                               \
    if (!vlm::sentencepiece_available(&vlmtest_sp_why)) GTEST_SKIP() << vlmtest_sp_why; \
  } while (0)
