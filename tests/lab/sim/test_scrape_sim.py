"""The router's load scraper reads the simulator's /metrics page as it reads vLLM's."""

from __future__ import annotations

from router.fleet.scrape import LoadScraper, scraped_pools
from router.lab.sim.config import EngineConfig
from router.lab.sim.request import new_request
from router.lab.sim.serve import EngineSpec, SimCluster
from router.lab.sim.server import ServerSettings
from router.lab.sim.timing import StepTimeModel
from tests.fleet.test_scrape import _runtime
from tests.support.profiles import MODEL


async def test_the_scraper_reads_live_simulated_servers() -> None:
    timing = StepTimeModel(c0=0.05, c_prefill=0.0, c_decode=0.0, c_ctx=0.0)
    config = EngineConfig(max_model_len=2048, max_num_batched_tokens=2048, max_num_seqs=1, num_gpu_blocks=512)
    specs = [EngineSpec(0, config, timing, ServerSettings(served_model_names=(MODEL,))) for _ in range(2)]
    async with SimCluster(specs) as cluster:
        busy = cluster.engines[0]
        for i in range(3):
            busy.add_request(new_request(f"r{i}", list(range(100)), max_tokens=500, ignore_eos=True), 0.0)
        busy.step(0.0)  # one runs (max_num_seqs 1), two wait; the engine's loop is not woken
        rt = _runtime(cluster.urls)
        scraper = LoadScraper(lambda: rt)
        try:
            await scraper.scrape(scraped_pools(rt), timeout=2.0)
        finally:
            await scraper.stop()
        loaded, idle = rt.pools["interactive"].backends
        assert loaded.scraped and idle.scraped
        assert (loaded.scraped_running, loaded.scraped_waiting) == (1.0, 2.0)
        assert loaded.scraped_kv_usage > 0
        assert (idle.scraped_running, idle.scraped_waiting, idle.scraped_kv_usage) == (0.0, 0.0, 0.0)
        assert loaded.load_score > idle.load_score
