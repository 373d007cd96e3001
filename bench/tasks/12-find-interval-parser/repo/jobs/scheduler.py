"""Keeps jobs and decides which are due."""

from dataclasses import dataclass, field

from jobs.spec import Schedule


@dataclass
class Job:
    name: str
    schedule: Schedule
    last_run: float | None = None

    def is_due(self, now: float) -> bool:
        """A job is due when it never ran or its interval has passed since the last run."""
        return self.last_run is None or now - self.last_run >= self.schedule.interval_seconds


@dataclass
class Scheduler:
    jobs: list[Job] = field(default_factory=list)

    def add(self, name: str, schedule_text: str) -> Job:
        """Add a job from text such as 'every 10m'."""
        job = Job(name, Schedule.from_text(schedule_text))
        self.jobs.append(job)
        return job

    def due(self, now: float) -> list[Job]:
        """Jobs that should run at time now, marked as run."""
        ready = [job for job in self.jobs if job.is_due(now)]
        for job in ready:
            job.last_run = now
        return ready
