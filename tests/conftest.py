"""Test-suite set-up: pagegraph's pytest plugin, and hypothesis profiles.

Running from a source tree (``PYTHONPATH=src``) the plugin's entry point is not installed, so it
is registered here; installed, the entry point has registered it already.
"""

import os

import pytest
from hypothesis import settings

settings.register_profile("ci", deadline=None, derandomize=True)
settings.register_profile("gpu", deadline=None, max_examples=500)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def no_leaked_ranges():
    """Fails a test that leaves pagegraph NVTX ranges open (and closes them for the next)."""
    from pagegraph.detect import ranges

    yield
    leaked = ranges.range_stack()
    while ranges.range_stack():
        ranges.pop()
    assert leaked == (), f"test left ranges open: {leaked}"


#: Tests over about 6 s each on the H200 host (``make test DURATIONS=120`` there, 16 workers):
#: child processes, end-to-end jobs, sm_90 compiles, long fuzz runs. With CUDA, ``make test``
#: leaves them (marker gpu_heavy) to ``make test-heavy``, as it leaves the cpu_heavy ones
#: without CUDA; CI on a CPU runs them all. By file, then test function (every parameter).
GPU_HEAVY: dict[str, tuple[str, ...]] = {
    "test_batch_ring.py": (
        "test_a_child_through_a_small_ring_gives_the_same_steps_and_tables",
        "test_a_rings_file_is_gone_once_its_child_sent_a_batch",
    ),
    "test_checker.py": ("test_graph_runner_fixture_releases_its_runners_when_the_test_fails",),
    "test_cli.py": (
        "test_an_interrupted_check_writes_its_reports_marked_incomplete",
        "test_python_dash_m_entry_point",
        "test_workload_process_flag_overrides_the_scenario",
    ),
    "test_compile.py": ("*",),  # the whole module: sm_90 compiles
    "test_csr.py": ("test_sglang_flashinfer_csr_is_exact_with_its_preset_and_crashes_without",),
    "test_decode_step.py": (
        "test_padded_leak_fails_on_gpu",
        "test_scenario_shapes_on_gpu",
        "test_static_width_consumer_fails_on_gpu",
    ),
    "test_first_hour.py": (
        "test_a_builder_by_absolute_file_path_is_checked",
        "test_a_builder_module_in_the_current_folder_loads_by_name",
        "test_a_builder_that_raises_is_unsafe_naming_the_exception_and_phase",
        "test_a_builder_that_raises_names_the_line_in_the_builders_code",
        "test_a_shipped_scenario_runs_by_name_from_another_folder",
        "test_an_unknown_scenario_is_one_line_naming_the_shipped_ones",
        "test_readme_builder_gets_the_verdict_the_readme_promises",
        "test_readme_planted_bug_is_unsafe_naming_the_properties",
        "test_readme_pytest_example_passes",
        "test_the_plugin_shows_the_report_and_not_its_own_source",
    ),
    "test_fuzz.py": (
        "test_fuzz_kernel",
        "test_fuzz_workloads",
    ),
    "test_isolate.py": (
        "test_a_hang_is_killed_at_the_timeout",
        "test_a_segfault_is_reported",
        "test_an_abort_is_reported_and_the_run_goes_on",
        "test_an_exit_is_reported",
        "test_assert_replay_safe_isolated",
        "test_cli_isolates_a_user_builder_by_default",
        "test_gpu_a_kernel_that_breaks_its_cuda_context_is_reported",
        "test_isolate_runs_the_decode_step_in_a_child",
    ),
    "test_memory_slots.py": ("test_a_jobs_slot_is_held_in_the_child_while_its_check_runs",),
    "test_metadata.py": ("test_compiles_for_sm90",),
    "test_paged_attention.py": (
        "test_graph_replays_follow_the_lengths_on_gpu",
        "test_kernels_compile_for_sm90",
    ),
    "test_plan.py": ("test_a_planned_check_runs_without_validating_again",),
    "test_process_cleanup.py": (
        "test_a_child_told_sigterm_stops_and_the_parent_reports_it",
        "test_children_end_with_the_parent",
        "test_reproducers_run_as_children_that_end_with_the_job",
        "test_a_warm_pools_workers_end_with_a_killed_parent",
        "test_workload_children_end_with_a_killed_parent",
    ),
    "test_producer.py": (
        "test_a_child_that_dies_is_reported",
        "test_a_verdict_does_not_depend_on_where_the_workload_ran",
        "test_same_steps_and_tables_as_decode_workload",
        "test_stopping_early_stops_the_child",
        "test_streams_take_turns_each_with_its_own_tables",
        "test_the_childs_exception_is_raised_at_its_step",
    ),
    "test_reader_cli.py": (
        "test_the_command_runs_a_users_reader_in_a_child_and_exits_1_when_it_fails",
    ),
    "test_sglang_clients.py": (
        "test_flashinfer_overflow_reproducer_flags_sglang_and_passes_pagegraph",
        "test_reproducer_exit_code_follows_its_finding",
    ),
    "test_sglang_job.py": ("test_job_writes_the_verdict_table_and_the_reproducers",),
    "test_sync.py": ("test_cupti_next_to_torch_profiler_is_reported_not_hidden",),
    "test_verdicts.py": ("test_crash_in_capture_is_not_rerun",),
    "test_vllm_job.py": (
        "test_a_hostile_run_is_labelled_outside_vllms_contract",
        "test_the_job_writes_a_verdict_per_pair",
    ),
    "test_wild.py": ("test_the_buggy_twin_fails_its_property_and_the_fixed_twin_is_safe",),
    "test_worker_pool.py": (
        "test_a_mutant_stops_at_its_first_kill_and_the_killed_set_is_the_same",
        "test_a_crashing_check_is_reported_as_a_fresh_child_reports_it",
        "test_mutate_with_warm_workers_matches_a_fresh_child_per_builder",
        "test_tasks_are_spread_over_warm_workers",
    ),
}


#: Tests of child processes and whole jobs over about 4 s each on 2 CPU cores (``make test
#: DURATIONS=45`` there): what they prove does not depend on the device, so without CUDA
#: ``make test`` leaves them (marker cpu_heavy) to ``make test-heavy`` as well. By file, then
#: test function (every parameter).
CPU_SLOW: dict[str, tuple[str, ...]] = {
    "test_checker.py": ("test_graph_runner_fixture_releases_its_runners_when_the_test_fails",),
    "test_cli.py": ("test_workload_process_flag_overrides_the_scenario",),
    "test_decode_step.py": ("test_cli_runs_the_decode_step",),
    "test_first_hour.py": (  # the README's own examples stay in make test
        "test_a_builder_by_absolute_file_path_is_checked",
        "test_a_builder_module_in_the_current_folder_loads_by_name",
        "test_a_shipped_scenario_runs_by_name_from_another_folder",
        "test_the_plugin_shows_the_report_and_not_its_own_source",
    ),
    "test_isolate.py": (
        "test_assert_replay_safe_isolated",
        "test_an_abort_is_reported_and_the_run_goes_on",
    ),
    "test_memory_slots.py": ("test_a_jobs_slot_is_held_in_the_child_while_its_check_runs",),
    "test_plan.py": ("test_a_planned_job_runs_in_a_child_without_planning_again",),
    "test_process_cleanup.py": ("*",),  # the whole module: killed parents and their children
    "test_producer.py": (
        "test_a_child_that_dies_is_reported",
        "test_streams_take_turns_each_with_its_own_tables",
    ),
    "test_verdicts.py": (
        "test_a_crash_during_replays_is_explained_by_a_serialised_rerun",
        "test_a_replay_that_raised_a_cuda_error_is_explained_like_a_crash",
    ),
    "test_vllm_job.py": (
        "test_a_hostile_run_is_labelled_outside_vllms_contract",
        "test_the_job_writes_a_verdict_per_pair",
    ),
    "test_worker_pool.py": ("test_tasks_are_spread_over_warm_workers",),
}


def _listed(table: dict[str, tuple[str, ...]], item) -> bool:
    tests = table.get(item.path.name, ())
    return "*" in tests or getattr(item, "originalname", item.name) in tests


def pytest_configure(config):
    import pagegraph.pytest_plugin as plugin

    # Installed, the entry point registered it already (under the entry point's name).
    if not config.pluginmanager.is_registered(plugin):
        config.pluginmanager.register(plugin, "pagegraph.pytest_plugin")


def pytest_collection_modifyitems(session, config, items):
    for item in items:
        if _listed(GPU_HEAVY, item):
            item.add_marker(pytest.mark.gpu_heavy)
        if _listed(CPU_SLOW, item):
            item.add_marker(pytest.mark.cpu_heavy)
    # torch.profiler (Kineto) holds CUPTI's one subscription for the rest of the process once
    # started, which would turn every CUPTI-detector test after it into a skip: run those
    # tests last. Before them, the heavy tests (child processes, compiles, long property runs:
    # 4 to 16 s each on the H200 host, most of the suite's time) come first, so that a parallel
    # run hands them out at its start and does not end waiting for one. The sort is stable:
    # a module's tests keep their order, and its module-scoped fixtures are made once.
    items.sort(
        key=lambda item: (
            item.get_closest_marker("torch_profiler") is not None,
            item.get_closest_marker("heavy") is None,
        )
    )


def pytest_sessionstart(session):
    # Under pytest-xdist with several GPUs, pin each worker to its own device, so "cuda" in a
    # test means that worker's GPU (make test starts at least one worker per visible GPU).
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw"):
        import torch

        if torch.cuda.is_available() and torch.cuda.device_count() > 1:
            torch.cuda.set_device(int(worker[2:]) % torch.cuda.device_count())
