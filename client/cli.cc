#include "client/cli.h"

#include <type_traits>
#include <utility>

#include "CLI/CLI.hpp"
#include "absl/time/time.h"

namespace fitrun::client {
namespace {

const CliArg kJobId{"id", "job id", &CliOptions::job_id};
const CliArg kSpec{"spec", "job spec YAML file", &CliOptions::spec_path};
const CliArg kJson{"--json", "print the reply as the proto's JSON mapping", &CliOptions::json};

// Adds one argument of the table to a subcommand's parser, bound to its member of options.
void AddArg(CLI::App* command, const CliArg& arg, CliOptions& options) {
  CLI::Option* option = std::visit(
      [&](auto member) -> CLI::Option* {
        auto& value = options.*member;
        if constexpr (std::is_same_v<std::decay_t<decltype(value)>, bool>) {
          return command->add_flag(arg.name, value, arg.help);
        } else {
          return command->add_option(arg.name, value, arg.help);
        }
      },
      arg.target);
  if (arg.name[0] != '-') option->required();
  if (arg.positive) option->check(CLI::PositiveNumber);
  if (arg.show_default) option->capture_default_str();
}

}  // namespace

const std::vector<Subcommand>& Subcommands() {
  static const std::vector<Subcommand>* const table = new std::vector<Subcommand>{
      {"submit",
       "submit a job spec (YAML) and print its id",
       {kSpec, {"--watch", "then follow the job as `fitrun watch` does", &CliOptions::watch}},
       [](const CommandEnv& env, const CliOptions& o) { return RunSubmit(env, o.spec_path, o.watch); }},
      {"watch",
       "follow a job's events and progress until it ends",
       {kJobId},
       [](const CommandEnv& env, const CliOptions& o) { return RunWatch(env, o.job_id); }},
      {"events",
       "print a job's events so far, one JSON object per line (for scripts)",
       {kJobId},
       [](const CommandEnv& env, const CliOptions& o) { return RunEvents(env, o.job_id); }},
      {"get",
       "show one job",
       {kJobId, kJson},
       [](const CommandEnv& env, const CliOptions& o) { return RunGet(env, o.job_id, o.json); }},
      {"list",
       "list jobs",
       {{"--state", "only jobs in this state (repeatable): queued, running, failed, ...", &CliOptions::states},
        kJson},
       [](const CommandEnv& env, const CliOptions& o) { return RunList(env, o.json, o.states); }},
      {"logs",
       "print a rank's log (stdout and stderr) of the job's latest attempt",
       {kJobId,
        {"--rank", "which rank", &CliOptions::rank, /*show_default=*/true},
        {"--follow,-f", "keep printing until the attempt ends", &CliOptions::follow}},
       [](const CommandEnv& env, const CliOptions& o) { return RunLogs(env, o.job_id, o.rank, o.follow); }},
      {"cancel",
       "stop every rank of a job",
       {kJobId, {"--reason", "recorded with the cancellation", &CliOptions::cancel_reason, /*show_default=*/true}},
       [](const CommandEnv& env, const CliOptions& o) { return RunCancel(env, o.job_id, o.cancel_reason); }},
      {"plan",
       "show the plan a spec would get now, without running it",
       {kSpec, kJson},
       [](const CommandEnv& env, const CliOptions& o) { return RunPlan(env, o.spec_path, o.json); }},
      {"devices",
       "list the coordinator's devices",
       {kJson},
       [](const CommandEnv& env, const CliOptions& o) { return RunDevices(env, o.json); }},
      {"top",
       "devices and unfinished jobs, refreshed in place until Ctrl-C (printed once into a pipe)",
       {{"--interval", "seconds between refreshes", &CliOptions::interval_seconds, /*show_default=*/true,
         /*positive=*/true},
        {"--once", "print the table once, plain, and exit", &CliOptions::once}},
       [](const CommandEnv& env, const CliOptions& o) {
         TopOptions top;
         top.interval = absl::Seconds(o.interval_seconds);
         top.once = o.once;
         return RunTop(env, top);
       },
       /*runs_until_interrupted=*/true},
  };
  return *table;
}

ParsedCommandLine ParseCommandLine(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  ParsedCommandLine parsed;
  CliOptions& options = parsed.options;
  CLI::App app{"fitrun: submit, plan, watch and manage training jobs on a fitrun coordinator."};
  app.set_version_flag("--version", "fitrun v1");
  app.require_subcommand(1);
  // Global flags are accepted after the command too: `fitrun list --coordinator=host:7070`.
  app.fallthrough();
  app.add_option("--coordinator", options.coordinator, "the coordinator's HOST:PORT")
      ->envname("FITRUN_COORDINATOR")
      ->capture_default_str();
  app.add_option("--ca", options.ca, "PEM CA that fitrund's certificate chains to: connect with TLS")
      ->envname("FITRUN_CA");
  app.add_option("--cert", options.cert, "PEM client certificate, for a fitrund with mutual TLS")
      ->envname("FITRUN_CERT");
  app.add_option("--key", options.key, "PEM key of --cert")->envname("FITRUN_KEY");
  app.add_option("--token", options.token, "bearer token, for a fitrund with users")->envname("FITRUN_TOKEN");
  // Before the subcommands are added: each takes the footer it finds.
  app.footer(
      "Exit codes: 0 ok; 1 job FAILED; 2 job CANCELLED; 3 coordinator unreachable or stream "
      "lost; 4 request refused by the coordinator; 5 local error (unreadable spec file); "
      "64 usage.");

  std::vector<std::pair<const CLI::App*, const Subcommand*>> parsers;
  for (const Subcommand& subcommand : Subcommands()) {
    CLI::App* parser = app.add_subcommand(subcommand.name, subcommand.help);
    for (const CliArg& arg : subcommand.args) AddArg(parser, arg, options);
    parsers.emplace_back(parser, &subcommand);
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version are "errors" with exit code 0.
    parsed.exit_code = app.exit(e, out, err) == 0 ? kExitOk : kExitUsage;
    return parsed;
  }
  for (const auto& [parser, subcommand] : parsers) {
    if (parser->parsed()) parsed.command = subcommand;
  }
  return parsed;
}

}  // namespace fitrun::client
