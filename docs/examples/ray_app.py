"""A Ray application whose own async actor starts durable jobs, awaits them and reacts to their
outcome (docs/ray-apps.md).

    python docs/examples/ray_app.py [--storage sqlite:///gallery.db]

`Gallery` is the application's actor: its methods are `async def`, so Ray runs it on an event
loop, where a blocking call would stall every other request the actor serves. It connects with
`await cr.Jobs.connect_async(...)` and uses `jobs.async_manager(...)`, which block nothing.
"""

from __future__ import annotations

import argparse
import asyncio

import ray
from pydantic import BaseModel

import choreography_ray as cr


class Photo(BaseModel):
    album: str
    name: str


class MakeThumbnail(cr.JobStep[Photo]):
    async def perform(self, request: Photo, context: cr.StepContext) -> cr.StepResult:
        if request.name.endswith(".raw"):
            return cr.StepResult.failed(f"{request.name}: raw files are not supported")
        await asyncio.sleep(0.01)  # decode, resize, upload
        return cr.StepResult.succeeded()


class AlbumRequest(BaseModel):
    album: str
    photos: list[str]


class MakeThumbnails(cr.Job[AlbumRequest]):
    def prepare_steps(self, request: AlbumRequest) -> list[cr.StepSpec]:
        return [
            self.create_step(MakeThumbnail, Photo(album=request.album, name=name))
            for name in request.photos
        ]


@ray.remote
class Gallery:
    """Publishes albums: one thumbnail job per album, all running at once."""

    def __init__(self, storage: str) -> None:
        self.storage = storage
        self.manager: cr.AsyncJobsManager | None = None

    async def jobs_manager(self) -> cr.AsyncJobsManager:
        if self.manager is None:
            jobs = await cr.Jobs.connect_async(storage=self.storage)
            self.manager = jobs.async_manager("gallery", "default")
        return self.manager

    async def publish(self, albums: dict[str, list[str]]) -> list[str]:
        manager = await self.jobs_manager()
        started = [
            await manager.start(MakeThumbnails, AlbumRequest(album=album, photos=photos))
            for album, photos in albums.items()
        ]
        states = await asyncio.gather(*(manager.wait(s.job_id, timeout=300) for s in started))
        return [
            await self.react(manager, album, state)
            for album, state in zip(albums, states, strict=True)
        ]

    async def react(self, manager: cr.AsyncJobsManager, album: str, state: cr.JobState) -> str:
        progress = state.progress
        if state.status is cr.JobStatus.COMPLETED_SUCCESSFULLY:
            return f"{album}: published, {progress.successful_steps} thumbnails"
        if state.status is cr.JobStatus.COMPLETED_WITH_FAILURES:
            failed = [step for step in await manager.steps(state.id) if step.status.is_failure]
            reasons = [m for step in failed for m in step.status_changes[-1].exception_messages]
            return (
                f"{album}: held back, {progress.failed_steps} of {progress.total_steps} "
                f"thumbnails failed ({'; '.join(reasons)})"
            )
        return f"{album}: not published, the job ended {state.status.name}"


if __name__ == "__main__":  # the actors import this module to find the job and step types
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--storage", default="sqlite:///gallery.db")
    args = parser.parse_args()
    ray.init()
    gallery = Gallery.remote(args.storage)
    albums = {
        "holiday": ["beach.jpg", "dunes.jpg", "harbour.jpg"],
        "studio": ["portrait.jpg", "portrait.raw", "still-life.jpg"],
    }
    for line in ray.get(gallery.publish.remote(albums)):
        print(line)
    ray.shutdown()
