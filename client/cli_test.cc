#include "client/cli.h"

#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "client/fake_coordinator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace fitrun::client {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;
using ::testing::StartsWith;

struct Parsed {
  ParsedCommandLine line;
  std::string out;
  std::string err;
};

// `fitrun ARGS...`, parsed.
Parsed Parse(const std::vector<std::string>& args) {
  std::vector<const char*> argv = {"fitrun"};
  for (const std::string& arg : args) argv.push_back(arg.c_str());
  std::ostringstream out, err;
  Parsed parsed{ParseCommandLine(static_cast<int>(argv.size()), argv.data(), out, err)};
  parsed.out = out.str();
  parsed.err = err.str();
  return parsed;
}

// The subcommand with its positional arguments filled in ("x" each): the least that parses.
std::vector<std::string> Minimal(const Subcommand& subcommand) {
  std::vector<std::string> args = {subcommand.name};
  for (const CliArg& arg : subcommand.args) {
    if (arg.name[0] != '-') args.push_back("x");
  }
  return args;
}

TEST(CliTest, HelpListsEverySubcommandWithItsLineInTheTablesOrder) {
  const Parsed parsed = Parse({"--help"});
  EXPECT_EQ(parsed.line.command, nullptr);
  EXPECT_EQ(parsed.line.exit_code, kExitOk);
  EXPECT_THAT(parsed.out, StartsWith("fitrun: submit, plan, watch and manage training jobs"));
  size_t previous = parsed.out.find("Subcommands:");
  ASSERT_NE(previous, std::string::npos);
  for (const Subcommand& subcommand : Subcommands()) {
    // "  NAME   HELP" on a line of its own.
    const std::string name = subcommand.name;
    const size_t at = parsed.out.find("\n  " + name + " ");
    ASSERT_NE(at, std::string::npos) << name;
    EXPECT_GT(at, previous) << name;
    const size_t end = parsed.out.find('\n', at + 1);
    EXPECT_EQ(absl::StripAsciiWhitespace(parsed.out.substr(at + 3 + name.size(), end - at - 3 - name.size())),
              subcommand.help);
    previous = at;
  }
  EXPECT_THAT(parsed.out, HasSubstr("Exit codes: 0 ok;"));
}

TEST(CliTest, EachSubcommandsHelpShowsItsUsageAndArguments) {
  for (const Subcommand& subcommand : Subcommands()) {
    const Parsed parsed = Parse({subcommand.name, "--help"});
    EXPECT_EQ(parsed.line.exit_code, kExitOk) << subcommand.name;
    EXPECT_THAT(parsed.out, StartsWith(std::string(subcommand.help) + "\nUsage: fitrun " + subcommand.name + " "));
    for (const CliArg& arg : subcommand.args) {
      EXPECT_THAT(parsed.out, HasSubstr(std::string(arg.name).substr(0, std::string(arg.name).find(','))))
          << subcommand.name;
      EXPECT_THAT(parsed.out, HasSubstr(arg.help)) << subcommand.name;
    }
  }
  EXPECT_THAT(Parse({"logs", "--help"}).out, HasSubstr("--rank INT=0"));
  EXPECT_THAT(Parse({"top", "--help"}).out, HasSubstr("--interval FLOAT:POSITIVE=2"));
}

TEST(CliTest, EachSubcommandIsDispatchedToItsOwnEntry) {
  std::set<std::string> names;
  for (const Subcommand& subcommand : Subcommands()) {
    EXPECT_TRUE(names.insert(subcommand.name).second) << "twice: " << subcommand.name;
    const Parsed parsed = Parse(Minimal(subcommand));
    EXPECT_EQ(parsed.line.command, &subcommand) << subcommand.name << ": " << parsed.err;
    EXPECT_EQ(parsed.line.exit_code, kExitOk);
  }
  EXPECT_EQ(names, (std::set<std::string>{"submit", "watch", "events", "get", "list", "logs", "cancel", "plan",
                                          "devices", "top"}));
}

TEST(CliTest, ArgumentsAndGlobalFlagsReachTheirOptions) {
  Parsed parsed = Parse({"logs", "j-1", "--rank", "2", "-f"});
  EXPECT_EQ(parsed.line.options.job_id, "j-1");
  EXPECT_EQ(parsed.line.options.rank, 2);
  EXPECT_TRUE(parsed.line.options.follow);

  // Global flags before or after the subcommand.
  parsed = Parse({"--token=t", "list", "--state", "running", "--state", "queued", "--json",
                  "--coordinator=host:1"});
  EXPECT_EQ(parsed.line.options.states, (std::vector<std::string>{"running", "queued"}));
  EXPECT_TRUE(parsed.line.options.json);
  EXPECT_EQ(parsed.line.options.coordinator, "host:1");
  EXPECT_EQ(parsed.line.options.token, "t");

  parsed = Parse({"cancel", "j-2"});
  EXPECT_EQ(parsed.line.options.cancel_reason, "cancelled with fitrun cancel");
  EXPECT_EQ(parsed.line.options.coordinator, "127.0.0.1:7070");
  parsed = Parse({"top", "--interval", "0.5", "--once"});
  EXPECT_EQ(parsed.line.options.interval_seconds, 0.5);
  EXPECT_TRUE(parsed.line.options.once);
  EXPECT_TRUE(parsed.line.command->runs_until_interrupted);
  parsed = Parse({"submit", "job.yaml", "--watch"});
  EXPECT_EQ(parsed.line.options.spec_path, "job.yaml");
  EXPECT_TRUE(parsed.line.options.watch);
  EXPECT_FALSE(parsed.line.command->runs_until_interrupted);
}

TEST(CliTest, UsageErrorsAndVersionRunNothing) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {}, {"bogus"}, {"get"}, {"get", "a", "b"}, {"top", "--interval=0"}, {"list", "--state"}}) {
    const Parsed parsed = Parse(args);
    EXPECT_EQ(parsed.line.command, nullptr);
    EXPECT_EQ(parsed.line.exit_code, kExitUsage);
    EXPECT_THAT(parsed.err, HasSubstr("Run with --help for more information."));
  }
  EXPECT_THAT(Parse({}).err, StartsWith("A subcommand is required"));
  EXPECT_THAT(Parse({"get"}).err, StartsWith("id is required"));
  const Parsed version = Parse({"--version"});
  EXPECT_EQ(version.line.command, nullptr);
  EXPECT_EQ(version.line.exit_code, kExitOk);
  EXPECT_EQ(version.out, "fitrun v1\n");
}

// Each entry's handler calls its own command with what was parsed: the fake coordinator records
// the requests (its unset replies make each command end with an error, which is not the point).
TEST(CliTest, EachHandlerRunsItsCommandWithTheParsedArguments) {
  const std::string spec = ::testing::TempDir() + "/cli_test_spec.yaml";
  std::ofstream(spec) << "name: cli\n";
  FakeCoordinator coordinator;
  std::ostringstream out, err;
  absl::Time now = absl::FromUnixSeconds(1700000000);
  CommandEnv env;
  env.coordinator = &coordinator;
  env.out = &out;
  env.err = &err;
  env.now = [&now] { return now; };
  env.sleep = [&now](absl::Duration d) { now += d; };

  std::set<std::string> ran;
  auto run = [&](const std::vector<std::string>& args) {
    const Parsed parsed = Parse(args);
    ASSERT_NE(parsed.line.command, nullptr) << parsed.err;
    ran.insert(parsed.line.command->name);
    parsed.line.command->run(env, parsed.line.options);
  };
  run({"submit", spec});
  EXPECT_THAT(coordinator.submitted_specs, ElementsAre("name: cli\n"));
  run({"watch", "j-1"});
  ASSERT_FALSE(coordinator.watches.empty());
  EXPECT_EQ(coordinator.watches[0].first, "j-1");
  run({"get", "j-2"});
  EXPECT_THAT(coordinator.got_job_ids, testing::Contains("j-2"));
  run({"events", "j-5"});
  EXPECT_THAT(coordinator.got_job_ids, testing::Contains("j-5"));
  run({"list", "--state", "running"});
  EXPECT_EQ(coordinator.list_jobs_calls, 1);
  EXPECT_THAT(coordinator.listed_states, ElementsAre(v1::JOB_STATE_RUNNING));
  run({"logs", "j-3", "--rank", "1"});
  EXPECT_THAT(coordinator.logs_requested, ElementsAre(Pair("j-3", 1)));
  run({"cancel", "j-4", "--reason", "enough"});
  EXPECT_THAT(coordinator.cancelled, ElementsAre(Pair("j-4", "enough")));
  run({"plan", spec});
  EXPECT_THAT(coordinator.planned_specs, ElementsAre("name: cli\n"));
  run({"devices"});
  EXPECT_EQ(coordinator.list_devices_calls, 1);
  run({"top", "--once"});
  EXPECT_GT(coordinator.list_devices_calls + coordinator.list_jobs_calls, 2);

  std::set<std::string> names;
  for (const Subcommand& subcommand : Subcommands()) names.insert(subcommand.name);
  EXPECT_EQ(ran, names);
}

}  // namespace
}  // namespace fitrun::client
