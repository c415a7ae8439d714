// Recipe parsing: shipped recipes validate; broken recipes fail naming file:line and key;
// overrides apply; the printed recipe parses back to the same recipe.
#include <gtest/gtest.h>

#include <chrono>

#include "app/config/recipe.h"
#include "app/config/sharding_options.h"
#include "tests/testing.h"
#include "vlm/runtime/check.h"

using vlm::app::Purpose;
using vlm::app::Recipe;

namespace {

const char* kMinimal = R"(
[model]
preset = "tiny"
[data]
train = ["a.jsonl"]
[schedule]
steps = 10
)";

// Parses `text` as "bad.toml", validates for training, returns the error message ("" if none).
std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    Recipe r = vlm::app::parse_recipe(text, "bad.toml", overrides);
    r.validate(Purpose::train);
  } catch (const vlm::Error& e) {
    return e.what();
  }
  return "";
}

TEST(Recipe, ShippedRecipesParseAndValidate) {
  for (const char* name : {"ocr_tiny.toml", "ocr_qwen.toml", "ocr_qwen25.toml"}) {
    std::string path = vlm::test::source_dir() + "/recipes/" + name;
    Recipe r = vlm::app::load_recipe(path);
    EXPECT_NO_THROW(r.validate(Purpose::train)) << name;
    EXPECT_NO_THROW(r.validate(Purpose::plan)) << name;
    EXPECT_FALSE(r.sharding.module.empty()) << name;
  }
  Recipe qwen = vlm::app::load_recipe(vlm::test::source_dir() + "/recipes/ocr_qwen.toml");
  EXPECT_EQ(qwen.precision.param_dtype, "bf16");
  EXPECT_EQ(qwen.sharding.module[0].policy, "freeze");
  EXPECT_EQ(qwen.sharding.module[2].strategy, "full_shard");
  EXPECT_EQ(qwen.activation_checkpointing.match, "model.layers.*");
  ASSERT_EQ(qwen.optim.group.size(), 1u);
  EXPECT_DOUBLE_EQ(*qwen.optim.group[0].lr, 2e-5);
  EXPECT_FALSE(qwen.optim.group[0].weight_decay.has_value());
}

TEST(Recipe, DefaultsAndRunName) {
  Recipe r = vlm::app::parse_recipe(kMinimal, "some/dir/my_run.toml");
  EXPECT_EQ(r.run.name, "my_run");
  EXPECT_EQ(r.dist.timeout_s, 600);
  EXPECT_EQ(r.data.max_image_tokens, 1024);
  EXPECT_EQ(r.sharding.default_policy, "ddp");
  EXPECT_EQ(r.data.train, std::vector<std::string>{"a.jsonl"});
}

// Expert parallelism: dist.ep reaches ParallelOptions, an ep rule the policy table.
TEST(Recipe, ExpertParallelKeys) {
  Recipe r = vlm::app::parse_recipe(std::string(kMinimal) + "[dist]\nep = 2\n[[sharding.module]]\nmatch = "
                                    "\"*.mlp.experts\"\npolicy = \"ep\"\n", "ep.toml");
  r.validate(Purpose::train);
  EXPECT_EQ(r.dist.ep, 2);
  EXPECT_EQ(vlm::app::parallel_options(r).ep, 2);
  const auto so = vlm::app::sharding_options(r);
  ASSERT_EQ(so.rules.size(), 1u);
  EXPECT_EQ(so.rules[0].policy, "ep");
  EXPECT_EQ(vlm::app::parallel_options(vlm::app::parse_recipe(kMinimal, "a.toml")).ep, 1) << "default: none";
}

struct BrokenCase {
  const char* name;
  std::string text;
  std::string location;   // expected "file:line" (or file alone for absent keys)
  std::string key;        // expected key named in the message
  std::string detail;     // expected fragment of the explanation
};

// dist.tp: the options, and what it does not take yet, refused with the key and the reason.
TEST(Recipe, TensorParallelKeys) {
  Recipe r = vlm::app::parse_recipe(std::string(kMinimal) + "[dist]\ntp = 4\n", "a.toml");
  r.validate(Purpose::train);
  EXPECT_EQ(vlm::app::parallel_options(r).tp, 4);
  EXPECT_EQ(vlm::app::parallel_options(vlm::app::parse_recipe(kMinimal, "a.toml")).tp, 1) << "default: none";
  const std::string tp = std::string(kMinimal) + "[dist]\ntp = 2\n";
  EXPECT_NE(error_of(tp, {"dist.cp=2"}).find("tensor parallelism with context or expert parallelism"), std::string::npos);
  EXPECT_NE(error_of(tp, {"model.sharded_load=false"}).find("needs model.sharded_load = true"), std::string::npos);
  EXPECT_NE(error_of(tp, {"data.eval=[\"e.jsonl\"]"}).find("evaluation inside a tensor-parallel run"),
            std::string::npos);
  EXPECT_EQ(error_of(tp, {"data.eval=[\"e.jsonl\"]", "eval.at_end=false"}), "") << "eval.every 0, no end eval";
  EXPECT_NE(error_of(tp + "[[sharding.module]]\nmatch = \"model.layers.*\"\npolicy = \"lora\"\n")
                .find("policy = \"lora\""),
            std::string::npos);
  EXPECT_NE(error_of(tp, {"model.router_aux_loss_coef=0.001"}).find("no MoE load-balancing loss"), std::string::npos);
  // `vlmtrain eval` holds the model whole: a tp recipe validates for evaluation.
  Recipe e = vlm::app::parse_recipe(tp, "a.toml", {"data.eval=[\"e.jsonl\"]"});
  EXPECT_NO_THROW(e.validate(Purpose::eval));
}

TEST(Recipe, PipelineParallelKeys) {
  Recipe r = vlm::app::parse_recipe(std::string(kMinimal) + "[dist]\npp = 2\ntp = 2\n", "a.toml");
  r.validate(Purpose::train);
  EXPECT_EQ(vlm::app::parallel_options(r).pp, 2);
  EXPECT_EQ(vlm::app::parallel_options(r).tp, 2);
  EXPECT_EQ(vlm::app::parallel_options(vlm::app::parse_recipe(kMinimal, "a.toml")).pp, 1) << "default: none";
  const std::string pp = std::string(kMinimal) + "[dist]\npp = 2\n";
  EXPECT_NE(error_of(pp, {"dist.ep=2"}).find("pipeline parallelism with context or expert parallelism"),
            std::string::npos);
  const std::string no_load = error_of(pp, {"model.sharded_load=false"});
  EXPECT_NE(no_load.find("key 'dist.pp'"), std::string::npos) << no_load;
  EXPECT_NE(no_load.find("each stage loads only its own layers"), std::string::npos) << no_load;
  EXPECT_NE(error_of(pp, {"data.eval=[\"e.jsonl\"]"}).find("evaluation inside a pipeline-parallel run"),
            std::string::npos);
  EXPECT_EQ(error_of(pp, {"data.eval=[\"e.jsonl\"]", "eval.at_end=false"}), "") << "eval.every 0, no end eval";
  EXPECT_NE(error_of(pp + "[[sharding.module]]\nmatch = \"model.layers.*\"\npolicy = \"lora\"\n")
                .find("which pipeline parallelism does not take yet"),
            std::string::npos);
  EXPECT_NE(error_of(pp, {"model.router_aux_loss_coef=0.001"}).find("no MoE load-balancing loss"), std::string::npos);
  Recipe e = vlm::app::parse_recipe(pp, "a.toml", {"data.eval=[\"e.jsonl\"]"});
  EXPECT_NO_THROW(e.validate(Purpose::eval));
}

TEST(Recipe, BrokenRecipesNameFileLineAndKey) {
  const std::string base = kMinimal;  // 7 lines incl. the leading newline: new keys start at 8
  std::vector<BrokenCase> cases = {
      {"unknown key", base + "[optim]\nlrr = 1e-4\n", "bad.toml:9", "optim.lrr", "did you mean 'optim.lr'"},
      {"unknown section", base + "[optimiser]\nlr = 1\n", "bad.toml:8", "optimiser", "unknown key"},
      {"wrong type", base + "[optim]\nlr = \"fast\"\n", "bad.toml:9", "optim.lr", "expected a number, got a string"},
      {"wrong type int", base + "[batch]\nsamples_per_rank = 2.5\n", "bad.toml:9", "batch.samples_per_rank",
       "expected an integer"},
      {"bad enum", base + "[schedule]\n", "", "", ""},  // placeholder replaced below
      {"negative lr", base + "[optim]\nlr = -0.1\n", "bad.toml:9", "optim.lr", "out of range"},
      {"zero lr", base + "[optim]\nlr = 0\n", "bad.toml:9", "optim.lr", "out of range"},
      {"rule with empty match",
       base + "[[sharding.module]]\nmatch = \"\"\npolicy = \"ddp\"\n", "bad.toml:9",
       "sharding.module[0].match", "empty match"},
      {"bad policy", base + "[[sharding.module]]\nmatch = \"model.*\"\npolicy = \"zero3\"\n",
       "bad.toml:10", "sharding.module[0].policy", "expected one of"},
      {"strategy for wrong policy",
       base + "[[sharding.module]]\nmatch = \"model.*\"\npolicy = \"ddp\"\nstrategy = \"full_shard\"\n",
       "bad.toml:8", "sharding.module[0].strategy", "does not apply"},
      {"missing policy", base + "[[sharding.module]]\nmatch = \"model.*\"\n", "bad.toml:8",
       "sharding.module[0].policy", "missing"},
      {"unknown key in rule", base + "[[sharding.module]]\nmatch = \"a\"\npolicy = \"ddp\"\nstrat = \"x\"\n",
       "bad.toml:11", "sharding.module[0].strat", "unknown key"},
      {"unknown preset", "[model]\npreset = \"huge\"\n[data]\ntrain = [\"a\"]\n[schedule]\nsteps = 1\n",
       "bad.toml:2", "model.preset", "unknown preset"},
      {"missing model path and preset", "[data]\ntrain = [\"a\"]\n[schedule]\nsteps = 1\n", "bad.toml", "model",
       "neither model.preset nor model.path"},
      {"both path and preset", base + "[model]\n", "", "", ""},  // duplicate table: TOML error
      {"no steps", "[model]\npreset = \"tiny\"\n[data]\ntrain = [\"a\"]\n", "bad.toml", "schedule.steps",
       "no training length"},
      {"no data", "[model]\npreset = \"tiny\"\n[schedule]\nsteps = 3\n", "bad.toml", "data.train",
       "no training data"},
      {"warmup longer than run", base + "[optim]\n", "", "", ""},
      {"min above max pixels", base + "", "", "", ""},
      {"array item wrong type", base + "[eval]\nmetrics = [\"cer\", 3]\n", "bad.toml:9", "eval.metrics[1]",
       "expected a string"},
      {"bad metric", base + "[eval]\nmetrics = [\"bleu\"]\n", "bad.toml:9", "eval.metrics[0]",
       "expected one of"},
      {"penalty not positive", base + "[eval]\nrepetition_penalty = 0.0\n", "bad.toml:9",
       "eval.repetition_penalty", "out of range"},
      {"top_p above one", base + "[eval]\ntop_p = 1.5\n", "bad.toml:9", "eval.top_p", "out of range"},
      {"do_sample not a bool", base + "[eval]\ndo_sample = 1\n", "bad.toml:9", "eval.do_sample",
       "expected true or false"},
      {"misspelt generation key", base + "[eval]\nrepetition_penalti = 1.1\n", "bad.toml:9",
       "eval.repetition_penalti", "did you mean 'eval.repetition_penalty'"},
      {"strategy for ep",
       base + "[[sharding.module]]\nmatch = \"*.mlp.experts\"\npolicy = \"ep\"\nstrategy = \"full_shard\"\n",
       "bad.toml:8", "sharding.module[0].strategy", "does not apply"},
      {"ep of zero", base + "[dist]\nep = 0\n", "bad.toml:9", "dist.ep", "out of range"},
  };
  // Cases whose text is easier to write whole.
  cases[4] = {"bad enum", std::string("[model]\npreset = \"tiny\"\n[data]\ntrain = [\"a\"]\n[schedule]\nsteps = 10\n") +
                              "decay = \"exponential\"\n",
              "bad.toml:7", "schedule.decay", "expected one of \"cosine\""};
  cases[14] = {"both path and preset",
               "[model]\npreset = \"tiny\"\npath = \"/m\"\n[data]\ntrain = [\"a\"]\n[schedule]\nsteps = 1\n",
               "bad.toml:3", "model.path", "both model.preset and model.path"};
  cases[17] = {"warmup longer than run",
               "[model]\npreset = \"tiny\"\n[data]\ntrain = [\"a\"]\n[schedule]\nsteps = 10\nwarmup_steps = 20\n",
               "bad.toml:7", "schedule.warmup_steps", "longer than the run"};
  cases[18] = {"min above max pixels",
               std::string(kMinimal).replace(std::string(kMinimal).find("[data]\n"), 7,
                                             "[data]\nmin_pixels = 5000\nmax_pixels = 4000\n"),
               "bad.toml:5", "data.min_pixels", "larger than max_pixels"};

  for (const auto& c : cases) {
    std::string msg = error_of(c.text);
    SCOPED_TRACE(c.name);
    ASSERT_FALSE(msg.empty()) << "recipe was accepted:\n" << c.text;
    EXPECT_EQ(msg.rfind(c.location + ":", 0), 0u) << msg;
    EXPECT_NE(msg.find("'" + c.key + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.detail), std::string::npos) << msg;
  }
}

TEST(Recipe, SyntaxErrorNamesFile) {
  std::string msg = error_of("[data\n");
  EXPECT_NE(msg.find("bad.toml"), std::string::npos) << msg;
  EXPECT_NE(msg.find("syntax"), std::string::npos) << msg;
}

// Regression tests from tests/fuzz/recipe_toml_fuzz.cpp: toml11 parses nesting recursively
// (stack overflow) and dotted keys in quadratic time, so the recipe's shape is bounded first.
TEST(Recipe, DeeplyNestedTomlIsAnErrorNotAStackOverflow) {
  for (const std::string open : {"[", "{a="}) {
    std::string text = "[model]\npreset = \"tiny\"\n";
    text += "x = ";
    for (int i = 0; i < 100000; ++i) text += open;
    const std::string msg = error_of(text);
    EXPECT_NE(msg.find("bad.toml:3: arrays / inline tables nested deeper than"), std::string::npos) << msg;
  }
  // Nesting within the limit is still parsed (and then rejected as an unknown key).
  const std::string msg = error_of(std::string(kMinimal) + "x = [[[[1]]]]\n");
  EXPECT_NE(msg.find("unknown key 'schedule.x'"), std::string::npos) << msg;
}

TEST(Recipe, LongDottedKeyIsRejectedQuickly) {
  std::string key = "a";
  for (int i = 0; i < 20000; ++i) key += ".a";  // was: minutes inside toml11
  for (const std::string& text : {key + " = 1\n", "[" + key + "]\n"}) {
    const auto start = std::chrono::steady_clock::now();
    const std::string msg = error_of(std::string(kMinimal) + text);
    EXPECT_NE(msg.find("a dotted key with more than"), std::string::npos) << msg;
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  }
  // Strings, comments and floats do not count as key parts.
  EXPECT_EQ(error_of(std::string(kMinimal) + "[run]\nname = \"" + key + "\"  # " + key + "\n"), "");
}

TEST(Recipe, MissingFileIsAClearError) {
  try {
    vlm::app::load_recipe("/nonexistent/recipe.toml");
    FAIL() << "no error";
  } catch (const vlm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/recipe.toml"), std::string::npos);
  }
}

TEST(Recipe, OverridesApplyWithTomlSyntax) {
  Recipe r = vlm::app::parse_recipe(kMinimal, "x.toml",
                                    {"optim.lr=2e-5", "run.output_dir=runs/other", "data.shuffle=false",
                                     "data.train=[\"b.jsonl\", \"c.jsonl\"]", "sharding.module=[]",
                                     "schedule.decay=linear"});
  EXPECT_DOUBLE_EQ(r.optim.lr, 2e-5);
  EXPECT_EQ(r.run.output_dir, "runs/other");
  EXPECT_FALSE(r.data.shuffle);
  EXPECT_EQ(r.data.train, (std::vector<std::string>{"b.jsonl", "c.jsonl"}));
  EXPECT_EQ(r.schedule.decay, "linear");
  EXPECT_EQ(r.location("optim.lr"), "--set optim.lr");

  // Index into an array of tables.
  Recipe q = vlm::app::load_recipe(vlm::test::source_dir() + "/recipes/ocr_qwen.toml",
                                   {"sharding.module.1.policy=fsdp"});
  EXPECT_EQ(q.sharding.module[1].policy, "fsdp");

  // A typo in an override is rejected like one in the file.
  std::string msg = error_of(kMinimal, {"optim.lrr=1"});
  EXPECT_NE(msg.find("--set optim.lrr"), std::string::npos) << msg;
  EXPECT_NE(msg.find("unknown key 'optim.lrr'"), std::string::npos) << msg;
  msg = error_of(kMinimal, {"optim.lr"});
  EXPECT_NE(msg.find("expected section.key=value"), std::string::npos) << msg;
}

TEST(Recipe, PrintedRecipeParsesBackIdentically) {
  for (const char* name : {"ocr_tiny.toml", "ocr_qwen.toml", "ocr_qwen25.toml"}) {
    Recipe r = vlm::app::load_recipe(vlm::test::source_dir() + "/recipes/" + name);
    std::string printed = vlm::app::to_toml(r);
    Recipe back = vlm::app::parse_recipe(printed, "printed.toml");
    back.run.name = r.run.name;  // derived from the file name when absent; printed explicitly anyway
    EXPECT_EQ(vlm::app::to_toml(back), printed) << name;
    EXPECT_EQ(vlm::app::recipe_hash(back), vlm::app::recipe_hash(r)) << name;
  }
  // Awkward strings survive the round trip.
  Recipe r = vlm::app::parse_recipe(kMinimal, "x.toml", {"data.prompt=\"quote \\\" tab \\t nl \\n é\""});
  Recipe back = vlm::app::parse_recipe(vlm::app::to_toml(r), "printed.toml");
  EXPECT_EQ(back.data.prompt, r.data.prompt);
  EXPECT_EQ(r.data.prompt, "quote \" tab \t nl \n é");
}

TEST(Recipe, HashChangesWithContent) {
  Recipe a = vlm::app::parse_recipe(kMinimal, "x.toml");
  Recipe b = vlm::app::parse_recipe(kMinimal, "x.toml", {"optim.lr=3e-4"});
  EXPECT_NE(vlm::app::recipe_hash(a), vlm::app::recipe_hash(b));
  EXPECT_EQ(vlm::app::recipe_hash(a), vlm::app::recipe_hash(vlm::app::parse_recipe(kMinimal, "x.toml")));
  EXPECT_EQ(vlm::app::recipe_hash(a).size(), 16u);
}

}  // namespace
